"""The Open Inference Protocol (KServe v2) routes, spoken to by the official ``tritonclient.http``
client (and by plain HTTP where a test needs a malformed request) against the live gunicorn server."""

import base64
import json

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

import contract
import synthetic
from live_server import live_server  # noqa: F401  (imported for its fixture)

MODEL = contract.DEFAULT_MODEL_NAME
PIXELS_SHAPE = [contract.IMAGE_SIZE, contract.IMAGE_SIZE, contract.CHANNELS]

#: Every test here needs the model trained and exported in the session (tests/serve/conftest.py).
pytestmark = pytest.mark.end_to_end


@pytest.fixture(scope="module")
def server(live_server):  # noqa: F811
    """``(base URL, tritonclient)`` for the session's live server."""
    client = triton.InferenceServerClient(url=live_server.removeprefix("http://"), network_timeout=60.0)
    yield live_server, client
    client.close()


@pytest.fixture(scope="module")
def images():
    return synthetic.make_images(2, seed=21)[0]  # six 32x32 images, two of each class


@pytest.fixture(scope="module")
def saved_model_says(model_base, images):
    """The SavedModel's own ``serving_default`` answers on ``images``: what every v2 answer must equal."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(model_base / "1")).signatures[contract.SIGNATURE_PIXELS]
    out = signature(**{contract.INPUT_PIXELS: tf.constant(images)})
    return {key: value.numpy() for key, value in out.items()}


def pixels_input(images, binary_data=True):
    tensor = triton.InferInput(contract.INPUT_PIXELS, list(images.shape), "UINT8")
    return tensor.set_data_from_numpy(images, binary_data=binary_data)


def bytes_input(datas, binary_data=True):
    tensor = triton.InferInput(contract.INPUT_BYTES, [len(datas)], "BYTES")
    return tensor.set_data_from_numpy(np.array(datas, dtype=object), binary_data=binary_data)


def assert_same_answers(result, expected):
    """The labels are the SavedModel's; the probabilities too, to LiteRT's float32 rounding."""
    # BYTES come back as bytes from binary data, as str from JSON.
    names = [n.decode() if isinstance(n, bytes) else n for n in result.as_numpy(contract.OUTPUT_CLASS_NAMES).tolist()]
    assert names == [n.decode() for n in expected[contract.OUTPUT_CLASS_NAMES].tolist()]
    assert result.as_numpy(contract.OUTPUT_CLASS_IDS).tolist() == expected[contract.OUTPUT_CLASS_IDS].tolist()
    probabilities = result.as_numpy(contract.OUTPUT_PROBABILITIES)
    assert probabilities.dtype == np.float32 and probabilities.shape == expected[contract.OUTPUT_PROBABILITIES].shape
    np.testing.assert_allclose(probabilities, expected[contract.OUTPUT_PROBABILITIES], rtol=0, atol=1e-5)


def test_server_and_model_health_and_metadata(server):
    url, client = server
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert not client.is_model_ready("nosuch") and not client.is_model_ready(MODEL, "7")
    meta = client.get_server_metadata()
    assert {"binary_tensor_data", "classification"} <= set(meta["extensions"]) and meta["name"]
    model = client.get_model_metadata(MODEL)
    assert model["name"] == MODEL and model["versions"] == ["1"]
    runtime = requests.get(f"{url}/api/v1/model", timeout=30).json().get("runtime")
    assert model["platform"] == ("tensorflow_savedmodel" if runtime in (None, "savedmodel") else runtime)
    assert model["inputs"] == [
        {"name": contract.INPUT_PIXELS, "datatype": "UINT8", "shape": [-1, *PIXELS_SHAPE]},
        {"name": contract.INPUT_BYTES, "datatype": "BYTES", "shape": [-1]},
    ]
    assert model["outputs"] == [
        {"name": contract.OUTPUT_PROBABILITIES, "datatype": "FP32", "shape": [-1, len(synthetic.CLASS_NAMES)]},
        {"name": contract.OUTPUT_CLASS_IDS, "datatype": "INT64", "shape": [-1]},
        {"name": contract.OUTPUT_CLASS_NAMES, "datatype": "BYTES", "shape": [-1]},
        {"name": contract.OUTPUT_OOD_SCORE, "datatype": "FP32", "shape": [-1]},
        {"name": contract.OUTPUT_IN_DISTRIBUTION, "datatype": "BOOL", "shape": [-1]},
    ]
    assert client.get_model_metadata(MODEL, "1") == model


@pytest.mark.parametrize("binary_data", [True, False], ids=["binary", "json"])
def test_infer_uint8_pixels_gives_the_saved_models_answers(server, images, saved_model_says, binary_data):
    _, client = server
    outputs = [triton.InferRequestedOutput(key, binary_data=binary_data) for key in contract.OUTPUTS]
    result = client.infer(MODEL, [pixels_input(images, binary_data)], outputs=outputs, request_id="r-1")
    response = result.get_response()
    assert response["model_name"] == MODEL and response["model_version"] == "1" and response["id"] == "r-1"
    assert_same_answers(result, saved_model_says)
    # No outputs named: all three, as binary data (tritonclient then asks binary_data_output).
    assert_same_answers(client.infer(MODEL, [pixels_input(images)], model_version="1"), saved_model_says)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_infer_bytes_images_decodes_as_the_json_api_does(server, images, fmt):
    url, client = server
    datas = [synthetic.encode(image, fmt) for image in images]
    result = client.infer(MODEL, [bytes_input(datas)])
    # The same files through /api/v1/predict: the same decoder, so the same labels and probabilities.
    api = requests.post(f"{url}/api/v1/predict", files=[("file", (f"{i}", d)) for i, d in enumerate(datas)], timeout=60)
    predictions = api.json()["predictions"]
    assert [n.decode() for n in result.as_numpy(contract.OUTPUT_CLASS_NAMES)] == [p["label"] for p in predictions]
    best = result.as_numpy(contract.OUTPUT_PROBABILITIES).max(axis=1)
    np.testing.assert_allclose(best, [p["probability"] for p in predictions], rtol=0, atol=1e-6)


def test_png_bytes_give_the_saved_models_answers_on_the_same_pixels(server, images, saved_model_says):
    _, client = server
    pngs = [synthetic.encode(image, "PNG") for image in images]  # lossless: the same pixels
    assert_same_answers(client.infer(MODEL, [bytes_input(pngs)]), saved_model_says)
    # BYTES in JSON: base64 under MLServer's content_type parameter (images are not UTF-8 text).
    body = {
        "inputs": [
            {
                "name": contract.INPUT_BYTES,
                "shape": [len(pngs)],
                "datatype": "BYTES",
                "parameters": {"content_type": "base64"},
                "data": [base64.b64encode(p).decode() for p in pngs],
            }
        ]
    }
    answer = requests.post(f"{server[0]}/v2/models/{MODEL}/infer", json=body, timeout=60)
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "application/json"
    outputs = {o["name"]: o for o in answer.json()["outputs"]}
    assert outputs[contract.OUTPUT_CLASS_NAMES]["data"] == [n.decode() for n in saved_model_says[contract.OUTPUT_CLASS_NAMES]]
    assert outputs[contract.OUTPUT_PROBABILITIES]["shape"] == list(saved_model_says[contract.OUTPUT_PROBABILITIES].shape)


def test_classification_extension_gives_the_top_k(server, images, saved_model_says):
    _, client = server
    result = client.infer(
        MODEL, [pixels_input(images)], outputs=[triton.InferRequestedOutput(contract.OUTPUT_PROBABILITIES, class_count=2)]
    )
    top = result.as_numpy(contract.OUTPUT_PROBABILITIES)
    assert top.shape == (len(images), 2)
    probabilities = saved_model_says[contract.OUTPUT_PROBABILITIES]
    for row, cells in enumerate(top):
        (p1, c1, label1), (p2, c2, _) = (cell.decode().split(":") for cell in cells)
        assert int(c1) == saved_model_says[contract.OUTPUT_CLASS_IDS][row]
        assert label1.encode() == saved_model_says[contract.OUTPUT_CLASS_NAMES][row]
        assert float(p1) == pytest.approx(probabilities[row].max(), abs=1e-5) and float(p1) >= float(p2)
        assert int(c2) == np.argsort(-probabilities[row], kind="stable")[1]


@pytest.mark.parametrize("runtime", ["litert", "litert-int8", "savedmodel"])
def test_every_runtime_answers_what_its_backend_predicts(model_base, images, runtime):
    """The routes only reach the model through the backend: on each runtime, v2 says what ``predict`` says."""
    from serve import create_app
    from serve.core.errors import ServeError

    app = create_app({"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": MODEL, "RUNTIME": runtime})
    backend = app.extensions["serve.backend"]
    backend.wait_loaded()
    try:
        try:
            expected = backend.infer(images).outputs
        except ServeError as e:  # export publishes a LiteRT model only when it passed its check
            pytest.skip(f"no {runtime} model in this export: {e}")
        web = app.test_client()
        pngs = [base64.b64encode(synthetic.encode(image)).decode() for image in images]
        for tensor in (
            {"name": contract.INPUT_PIXELS, "shape": list(images.shape), "datatype": "UINT8", "data": images.ravel().tolist()},
            {"name": contract.INPUT_BYTES, "shape": [len(images)], "datatype": "BYTES", "data": pngs,
             "parameters": {"content_type": "base64"}},
        ):
            answer = web.post(f"/v2/models/{MODEL}/infer", json={"inputs": [tensor]})
            assert answer.status_code == 200, answer.json
            outputs = {o["name"]: o for o in answer.json["outputs"]}
            assert outputs[contract.OUTPUT_CLASS_NAMES]["data"] == [n.decode() for n in expected[contract.OUTPUT_CLASS_NAMES]]
            assert outputs[contract.OUTPUT_CLASS_IDS]["data"] == expected[contract.OUTPUT_CLASS_IDS].tolist()
            probabilities = np.float32(outputs[contract.OUTPUT_PROBABILITIES]["data"]).reshape(outputs[contract.OUTPUT_PROBABILITIES]["shape"])
            np.testing.assert_array_equal(probabilities, expected[contract.OUTPUT_PROBABILITIES])
        runtime_now = backend.info().runtime
        assert web.get(f"/v2/models/{MODEL}").json["platform"] == ("tensorflow_savedmodel" if runtime_now in (None, "savedmodel") else runtime_now)
    finally:
        backend.close()


def test_a_gzip_request_is_inflated(server, images, saved_model_says):
    _, client = server
    result = client.infer(MODEL, [pixels_input(images)], request_compression_algorithm="gzip")
    assert_same_answers(result, saved_model_says)


def test_tritonclient_sees_bad_tensors_as_4xx(server, images):
    _, client = server
    wrong_shape = triton.InferInput(contract.INPUT_PIXELS, [len(images), 32, 96], "UINT8")
    wrong_shape.set_data_from_numpy(images.reshape(len(images), 32, 96))
    wrong_type = triton.InferInput(contract.INPUT_PIXELS, list(images.shape), "FP32")
    wrong_type.set_data_from_numpy(images.astype(np.float32))
    cases = [
        (MODEL, "", wrong_shape, "400", "must have shape [-1, 32, 32, 3]"),
        (MODEL, "", wrong_type, "400", "must have datatype UINT8"),
        (MODEL, "", bytes_input([b"not an image"]), "400", "element 0 is not an image"),
        ("nosuch", "", pixels_input(images), "404", "unknown model 'nosuch'"),
        (MODEL, "7", pixels_input(images), "404", "no version '7'"),
    ]
    for model, version, tensor, status, message in cases:
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, [tensor], model_version=version)
        assert raised.value.status() == status and message in raised.value.message(), (status, message)
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata(MODEL, "7")
    assert raised.value.status() == "404"


def _tensor(data=None, shape=(1, 32, 32, 3), datatype="UINT8", name=contract.INPUT_PIXELS, **extra):
    tensor = {"name": name, "shape": list(shape), "datatype": datatype, **extra}
    if data is not None:
        tensor["data"] = data
    return tensor


ZEROS = [0] * 3072
BAD_REQUESTS = {
    "malformed JSON": ({"data": b'{"inputs": [', "headers": {"Content-Type": "application/json"}}, 400, "not valid JSON"),
    "not an object": ({"json": [1, 2]}, 400, "must be a JSON object"),
    "no inputs": ({"json": {"inputs": []}}, 400, '"inputs" must be a non-empty list'),
    "unknown input": ({"json": {"inputs": [_tensor(ZEROS, name="pixels")]}}, 400, "takes inputs ['images'], got 'pixels'"),
    "two inputs": (
        {"json": {"inputs": [_tensor(ZEROS), _tensor(["x"], shape=[1], datatype="BYTES", name=contract.INPUT_BYTES)]}},
        400,
        "takes inputs ['images'], got 'image_bytes', 'images'",
    ),
    "wrong shape": ({"json": {"inputs": [_tensor(ZEROS, shape=[1, 3072])]}}, 400, "must have shape"),
    "negative dim": ({"json": {"inputs": [_tensor(ZEROS, shape=[-1, 32, 32, 3])]}}, 400, "non-negative whole numbers"),
    "wrong datatype": ({"json": {"inputs": [_tensor(ZEROS, datatype="FP32")]}}, 400, "must have datatype UINT8"),
    "short data": ({"json": {"inputs": [_tensor([0] * 10)]}}, 400, "has 10 values; shape [1, 32, 32, 3] needs 3072"),
    "ragged data": ({"json": {"inputs": [_tensor([[0] * 3, [0] * 2])]}}, 400, "not a tensor"),
    "data nested too deeply": ({"json": {"inputs": [_tensor(json.loads("[" * 500 + "0" + "]" * 500))]}}, 400, "not a tensor"),
    "body nested too deeply": ({"data": b"[" * 100_000 + b"]" * 100_000}, 400, "not valid JSON"),
    "float pixels": ({"json": {"inputs": [_tensor([0.5] * 3072)]}}, 400, "whole numbers 0..255"),
    "out of range": ({"json": {"inputs": [_tensor([300] * 3072)]}}, 400, "outside the UINT8 range"),
    "no data": ({"json": {"inputs": [_tensor()]}}, 400, "has no data"),
    "bytes not strings": (
        {"json": {"inputs": [_tensor([1], shape=[1], datatype="BYTES", name=contract.INPUT_BYTES)]}},
        400,
        "must hold strings, got int values",
    ),
    "bytes count": (
        {"json": {"inputs": [_tensor(["a", "b"], shape=[3], datatype="BYTES", name=contract.INPUT_BYTES)]}},
        400,
        "has 2 elements; its shape needs 3",
    ),
    "bad base64": (
        {
            "json": {
                "inputs": [
                    _tensor(["%%%"], shape=[1], datatype="BYTES", name=contract.INPUT_BYTES, parameters={"content_type": "base64"})
                ]
            }
        },
        400,
        "not valid base64",
    ),
    "unknown output": ({"json": {"inputs": [_tensor(ZEROS)], "outputs": [{"name": "logits"}]}}, 400, "unknown output 'logits'"),
    "classify ids": (
        {"json": {"inputs": [_tensor(ZEROS)], "outputs": [{"name": "class_ids", "parameters": {"classification": 2}}]}},
        400,
        "classification applies to 'probabilities'",
    ),
    "unknown encoding": ({"data": b"{}", "headers": {"Content-Encoding": "br"}}, 415, "Content-Encoding 'br'"),
    "bad gzip": ({"data": b"not gzip", "headers": {"Content-Encoding": "gzip"}}, 400, "not valid gzip"),
}


def _binary_request(header, tail, header_length=None):
    header = json.dumps(header).encode()
    length = len(header) if header_length is None else header_length
    return {"data": header + tail, "headers": {"Inference-Header-Content-Length": str(length)}}


BAD_REQUESTS.update(
    {
        "binary too short": (
            _binary_request({"inputs": [_tensor(parameters={"binary_data_size": 100})]}, b"\0" * 100),
            400,
            "its binary data holds 100 bytes; shape [1, 32, 32, 3] needs 3072",
        ),
        "binary size beyond the body": (
            _binary_request({"inputs": [_tensor(parameters={"binary_data_size": 3072})]}, b"\0" * 10),
            400,
            "only 10 are left",
        ),
        "bytes left over": (
            _binary_request({"inputs": [_tensor(parameters={"binary_data_size": 3072})]}, b"\0" * 3080),
            400,
            "8 bytes after the JSON header belong to no input",
        ),
        "bad header length": (_binary_request({"inputs": []}, b"", header_length=10**6), 400, "Inference-Header-Content-Length is"),
        "bytes element overruns": (
            _binary_request(
                {"inputs": [_tensor(shape=[1], datatype="BYTES", name=contract.INPUT_BYTES, parameters={"binary_data_size": 6})]},
                b"\x10\0\0\0ab",
            ),
            400,
            "element 0 declares 16 bytes, but only 2 are left",
        ),
    }
)


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_get_a_json_error_with_a_4xx(server, case):
    url, _ = server
    kwargs, status, message = BAD_REQUESTS[case]
    response = requests.post(f"{url}/v2/models/{MODEL}/infer", timeout=30, **kwargs)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


def test_unknown_routes_and_methods_under_v2_are_json(server):
    url, _ = server
    missing = requests.get(f"{url}/v2/models/{MODEL}/stats", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]
    wrong_method = requests.get(f"{url}/v2/models/{MODEL}/infer", timeout=30)
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]
    assert requests.get(f"{url}/v2/models/nosuch/ready", timeout=30).status_code == 404
    assert requests.get(f"{url}/v2/health/ready", timeout=30).status_code == 200


def test_client_via_v2_health_info_and_unknown_model(server, capsys):
    from client import cli

    url, _ = server
    assert cli.main(["health", "--via", "v2", "--url", url]) == 0
    assert '"versions": [1]' in capsys.readouterr().out
    assert cli.main(["info", "--json", "--via", "v2", "--url", url]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["name"] == MODEL and info["version"] == 1
    assert info["signatures"]["infer"]["inputs"][contract.INPUT_BYTES] == {"datatype": "BYTES", "shape": [-1]}
    assert cli.main(["health", "--via", "v2", "--url", url, "--model", "nosuch"]) == 1
    assert "unknown model 'nosuch'" in capsys.readouterr().err
