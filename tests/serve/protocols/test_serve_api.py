"""The Flask app in-process (test client): the JSON API, TF Serving's REST API, the form, health and metrics over the
fake backend (``client``), and, marked ``end_to_end``, what the local backend answers over the exported ``model_base``
(``real_client``), checked against the SavedModel itself."""

import base64
import io
import re
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import contract
import fake_backend
import synthetic
from serve.settings import DEFAULT_MAX_PIXELS

LABELS = synthetic.CLASS_NAMES


@pytest.fixture(scope="module")
def samples():
    """Held-out images of the three learnable classes, and their labels."""
    return synthetic.make_images(4, seed=7)


def reference_model(model_base):
    return tf.saved_model.load(str(model_base / "1")).signatures[contract.SIGNATURE_PIXELS]


@pytest.fixture(scope="module")
def savedmodel(model_base):
    """The SavedModel's own ``serving_default``: what every answer is checked against."""
    return reference_model(model_base)


def fake_probabilities(pixels):
    """The fake backend's probabilities for one uint8 ``[32, 32, 3]`` image."""
    return fake_backend.expected(pixels[None])[contract.OUTPUT_PROBABILITIES][0]


def model_probabilities(savedmodel, pixels):
    """The SavedModel's probabilities for one uint8 ``[32, 32, 3]`` image."""
    return savedmodel(images=tf.constant(pixels[None]))[contract.OUTPUT_PROBABILITIES].numpy()[0]


def answered_probabilities(prediction):
    """An answer's probabilities by class id (the default top_k of 3 covers all three classes)."""
    probabilities = np.full(len(LABELS), np.nan)
    for entry in prediction["top_k"]:
        probabilities[entry["class_id"]] = entry["probability"]
    assert not np.isnan(probabilities).any(), prediction
    return probabilities


def png(array):
    return synthetic.encode(array, "PNG")


def upload(*files):
    return {"file": [(io.BytesIO(data), name) for name, data in files]}


def b64(data):
    return base64.b64encode(data).decode("ascii")


# -- predictions -------------------------------------------------------------------------


@pytest.mark.end_to_end
def test_predict_multipart_labels_match(real_client, samples, model_base):
    images, labels = samples
    files = [(f"img{i}.png", png(image)) for i, image in enumerate(images)]
    response = real_client.post("/api/v1/predict", data=upload(*files))
    assert response.status_code == 200
    body = response.get_json()
    assert body["model"] == {"name": "cifar10", "version": 1, "architecture": "seed_cnn"}
    predictions = body["predictions"]
    assert [p["filename"] for p in predictions] == [name for name, _ in files]
    # Exactly what the SavedModel itself says for these pixels...
    direct = reference_model(model_base)(images=tf.constant(images))
    assert [p["class_id"] for p in predictions] == direct[contract.OUTPUT_CLASS_IDS].numpy().tolist()
    top = direct[contract.OUTPUT_PROBABILITIES].numpy().max(axis=1)
    assert [p["probability"] for p in predictions] == pytest.approx(top.tolist(), abs=1e-5)
    # ...and mostly the true labels (the fixture's 3-epoch model is ~70% right; chance is 33%).
    right = sum(p["label"] == LABELS[y] and p["class_id"] == y for p, y in zip(predictions, labels))
    assert right >= 0.6 * len(labels)
    for p in predictions:
        assert len(p["top_k"]) == 3
        assert p["top_k"][0] == {"label": p["label"], "class_id": p["class_id"], "probability": p["probability"]}
        probs = [t["probability"] for t in p["top_k"]]
        assert probs == sorted(probs, reverse=True)
        assert sum(probs) == pytest.approx(1.0, abs=1e-4)  # three classes: top-3 is everything


def test_predict_json_b64_matches_multipart(client, samples):
    images, _ = samples
    multipart = client.post("/api/v1/predict", data=upload(("a.png", png(images[0])))).get_json()
    response = client.post("/api/v1/predict?top_k=1", json={"instances": [{"b64": b64(png(images[0]))}]})
    assert response.status_code == 200
    (p,) = response.get_json()["predictions"]
    assert p["filename"] is None
    assert len(p["top_k"]) == 1
    assert p["label"] == multipart["predictions"][0]["label"]
    assert p["probability"] == multipart["predictions"][0]["probability"]


def test_the_service_runs_without_flask(app, samples):
    """The core of every route needs no app: its backend, limits and metrics are handed in."""
    import flask

    from serve.core import Answered, InferenceService, InferRequest, Limits, Refused, Tensor, Upload
    from serve.telemetry.metrics import Metrics

    images, _ = samples
    metrics = Metrics()
    core = InferenceService(app.extensions["serve.backend"], "cifar10", Limits(max_images=8, max_pixels=32 * 32, top_k=3, max_request_pixels=10**6),
                            metrics)
    uploads = [
        Upload("a.png", png(images[0])),
        Upload(error="is not valid base64"),
        Upload("big.png", png(np.zeros((33, 32, 3), np.uint8))),
    ]
    assert not flask.has_app_context()
    result = core.infer(InferRequest({"image_bytes": Tensor(uploads)}, signature="predict_images", top_k=2, per_image=True))
    assert result.model.name == "cifar10" and result.version == 1
    first, second, third = result.images
    assert isinstance(first, Answered) and isinstance(second, Refused) and isinstance(third, Refused)
    assert first.top_k[0].class_id == int(np.argmax(fake_probabilities(images[0])))
    assert len(first.top_k) == 2
    assert second.public() == {"filename": None, "error": "instance 1: is not valid base64", "status": 400}
    assert third.status == 413 and str(third.error).startswith("'big.png' has too many pixels")
    exposition = metrics.exposition()[0].decode()
    assert "serve_images_total 1.0" in exposition  # only the image that reached the model


def test_predict_any_file_field_and_form_top_k(client, samples):
    images, _ = samples
    data = {"image": (io.BytesIO(png(images[0])), "x.png"), "top_k": "2"}
    response = client.post("/api/v1/predict", data=data)
    assert response.status_code == 200
    assert len(response.get_json()["predictions"][0]["top_k"]) == 2


def test_pixels_agree_with_model_bytes_signature(client, samples):
    """Server-side decoding matches the SavedModel's own predict_images for 32x32 PNGs."""
    images, _ = samples
    ours = client.post("/api/v1/predict", data=upload(("a.png", png(images[1])))).get_json()["predictions"][0]
    response = client.post(
        "/v1/models/cifar10:predict",
        json={"signature_name": contract.SIGNATURE_BYTES, "instances": [{"b64": b64(png(images[1]))}]},
    )
    assert response.status_code == 200
    (row,) = response.get_json()["predictions"]
    assert row[contract.OUTPUT_CLASS_IDS] == ours["class_id"]
    assert max(row[contract.OUTPUT_PROBABILITIES]) == pytest.approx(ours["probability"], abs=1e-5)


def test_partial_failure_keeps_good_images(client, samples):
    images, _ = samples
    response = client.post(
        "/api/v1/predict",
        data=upload(("good.png", png(images[0])), ("notes.txt", b"hello"), ("scan.tif", synthetic.encode(Image.fromarray(images[1]), "TIFF"))),
    )
    assert response.status_code == 200
    good, text, tiff = response.get_json()["predictions"]
    assert "label" in good
    assert text["status"] == 400 and "notes.txt" in text["error"] and text["filename"] == "notes.txt"
    assert tiff["status"] == 415 and "TIFF" in tiff["error"]


def test_all_bad_is_4xx_naming_the_files(client):
    response = client.post("/api/v1/predict", data=upload(("a.txt", b"xx"), ("b.txt", b"yy")))
    assert response.status_code == 400
    body = response.get_json()
    assert "a.txt" in body["error"] and "b.txt" in body["error"]
    assert [p["status"] for p in body["predictions"]] == [400, 400]


# -- bad input ---------------------------------------------------------------------------


def _bomb():
    # 20000 x 20000 pixels declared (above the server's limit), a few hundred bytes compressed.
    return synthetic.encode(Image.new("1", (20000, 20000)), "PNG")


def _truncated(images):
    data = png(images[0])
    return data[: len(data) // 2]


BAD_UPLOADS = {
    "not-an-image": (lambda images: b"this is plain text, not a picture", 400),
    "empty-file": (lambda images: b"", 400),
    "truncated-png": (_truncated, 400),
    "tiff": (lambda images: synthetic.encode(Image.fromarray(images[0]), "TIFF"), 415),
    "ico": (lambda images: synthetic.encode(Image.fromarray(images[0]), "ICO"), 415),
    "decompression-bomb": (lambda images: _bomb(), 413),
}


@pytest.mark.parametrize("case", sorted(BAD_UPLOADS))
def test_bad_upload(client, samples, case):
    make, status = BAD_UPLOADS[case]
    response = client.post("/api/v1/predict", **synthetic.multipart(("upload.bin", make(samples[0]))))
    assert response.status_code == status
    body = response.get_json()
    assert "upload.bin" in body["error"]
    assert body["predictions"][0]["status"] == status


@pytest.mark.parametrize(
    "kwargs, status",
    [
        ({"data": b'{"instances": [', "content_type": "application/json"}, 400),
        ({"json": {"instances": [{"b64": "%%% not base64 %%%"}]}}, 400),
        ({"json": {"instances": ["no-b64-key"]}}, 400),
        ({"json": {"instances": []}}, 400),
        ({"json": {"images": []}}, 400),
        ({"data": {"nothing": "here"}}, 400),
        ({"data": b"raw bytes", "content_type": "application/octet-stream"}, 400),
    ],
    ids=["bad-json", "bad-b64", "no-b64", "empty", "no-instances", "no-file", "raw-body"],
)
def test_bad_request_body(client, kwargs, status):
    response = client.post("/api/v1/predict", **kwargs)
    assert response.status_code == status
    assert response.get_json()["error"]


@pytest.mark.parametrize("top_k", ["zero", "0", "-1"])
def test_bad_top_k(client, samples, top_k):
    response = client.post(f"/api/v1/predict?top_k={top_k}", data=upload(("a.png", png(samples[0][0]))))
    assert response.status_code == 400
    assert "top_k" in response.get_json()["error"]


def test_too_large_is_json_413(client):
    response = client.post("/api/v1/predict", data=upload(("big.png", b"\0" * (2 * 1024 * 1024))))
    assert response.status_code == 413
    assert "limit" in response.get_json()["error"]


def test_too_large_on_form_shows_words(client):
    response = client.post("/", data=upload(("big.png", b"\0" * (2 * 1024 * 1024))))
    assert response.status_code == 413
    assert b"larger than" in response.data


def test_uploads_stay_in_memory(client, monkeypatch):
    """A big part is neither spooled to a temporary file nor refused: nothing touches the disk."""
    import tempfile

    def no_disk(*args, **kwargs):
        raise AssertionError("an upload went to a temporary file")

    for name in ("TemporaryFile", "NamedTemporaryFile", "SpooledTemporaryFile", "mkstemp"):
        monkeypatch.setattr(tempfile, name, no_disk)
    response = client.post("/api/v1/predict", **synthetic.multipart(("big.bin", b"\1" * 700_000)))
    assert response.status_code == 400
    assert "big.bin" in response.get_json()["error"] and "not an image" in response.get_json()["error"]


# -- image handling ----------------------------------------------------------------------


def predict_one(client, data, name="x"):
    response = client.post("/api/v1/predict", data=upload((name, data)))
    assert response.status_code == 200, response.get_json()
    return response.get_json()["predictions"][0]


@pytest.mark.end_to_end
def test_exif_orientation_is_applied(real_client, savedmodel):
    """A stored-sideways JPEG with Orientation=6 must be classified upright."""
    from serve.core import decode as imaging

    upright = np.zeros((32, 32, 3), np.uint8)
    upright[:8] = 255  # a white band at the top
    stored = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)  # band now on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    data = synthetic.encode(stored, "JPEG", quality=95, exif=exif.tobytes())
    pixels, fmt = imaging.decode(data, DEFAULT_MAX_PIXELS)
    assert fmt == "JPEG"
    assert pixels[:8].mean() > 200 and pixels[-8:].mean() < 50
    # The answer is the model's on the upright pixels, which is not its answer on the stored ones.
    upright_answer = model_probabilities(savedmodel, pixels)
    sideways_answer = model_probabilities(savedmodel, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    assert np.abs(upright_answer - sideways_answer).max() > 1e-2, "the image tells the two apart"
    assert answered_probabilities(predict_one(real_client, data)) == pytest.approx(upright_answer, abs=1e-4)


def _mode_cases(image):
    rgb = Image.fromarray(image)
    gray16 = Image.fromarray((np.asarray(rgb.convert("L"), np.uint16) * 257)).convert("I;16")
    return {
        "P": (rgb.convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        "L": (rgb.convert("L"), "PNG"),
        "LA": (rgb.convert("LA"), "PNG"),
        "RGBA": (rgb.convert("RGBA"), "PNG"),
        "CMYK": (rgb.convert("CMYK"), "JPEG"),
        "I;16": (gray16, "PNG"),
        "GIF": (rgb.convert("P"), "GIF"),
        "BMP": (rgb, "BMP"),
        "WEBP": (rgb, "WEBP"),
        "big-JPEG": (rgb.resize((300, 200)), "JPEG"),
    }


def _expected_rgb(data, mode, original):
    """The pixels the server should classify, by Pillow directly: RGB, alpha dropped, 32x32 BILINEAR."""
    if mode == "I;16":  # Pillow's own convert clips 16-bit values; the server scales them to 8 bits
        image = Image.fromarray(original).convert("L")
    else:
        image = Image.open(io.BytesIO(data))
    return np.asarray(image.convert("RGB").resize((32, 32), Image.Resampling.BILINEAR))


@pytest.mark.end_to_end
@pytest.mark.parametrize("mode", ["P", "L", "LA", "RGBA", "CMYK", "I;16", "GIF", "BMP", "WEBP", "big-JPEG"])
def test_modes_and_formats_become_rgb(real_client, samples, savedmodel, mode):
    from serve.core import decode as imaging

    image, fmt = _mode_cases(samples[0][0])[mode]
    data = synthetic.encode(image, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    pixels, _ = imaging.decode(data, DEFAULT_MAX_PIXELS)
    assert pixels.shape == (32, 32, 3) and pixels.dtype == np.uint8
    if mode in ("L", "LA", "I;16"):  # grey stays grey, at the same brightness
        expected = np.asarray(Image.fromarray(samples[0][0]).convert("L"), np.float64)
        assert np.abs(pixels[..., 0].astype(np.float64) - expected).mean() < 2
        assert (pixels[..., 0] == pixels[..., 1]).all()
    if mode in ("RGBA", "BMP", "WEBP"):  # lossless RGB content survives exactly
        assert (pixels == samples[0][0]).all()
    expected = _expected_rgb(data, mode, samples[0][0])
    assert np.abs(pixels.astype(int) - expected).max() <= 1
    answer = answered_probabilities(predict_one(real_client, data))
    assert answer == pytest.approx(model_probabilities(savedmodel, expected), abs=1e-3)


def test_animated_gif_uses_first_frame(client, samples):
    from serve.core import decode as imaging

    frames = [Image.fromarray(samples[0][i]).convert("RGB") for i in range(2)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    first, _ = imaging.decode(buffer.getvalue(), DEFAULT_MAX_PIXELS)
    alone, _ = imaging.decode(synthetic.encode(frames[0], "GIF"), DEFAULT_MAX_PIXELS)
    assert (first == alone).all()


# -- model info, TF Serving-compatible API -----------------------------------------------


def test_model_info(client):
    body = client.get("/api/v1/model").get_json()
    assert body["name"] == "cifar10" and body["version"] == 1 and body["architecture"] == "seed_cnn"
    assert body["class_names"] == list(LABELS)
    assert body["backend"] == "local"
    pixels = body["signatures"][contract.SIGNATURE_PIXELS]
    assert pixels["inputs"] == {contract.INPUT_PIXELS: {"dtype": "uint8", "shape": [-1, 32, 32, 3]}}
    assert pixels["outputs"][contract.OUTPUT_PROBABILITIES] == {"dtype": "float", "shape": [-1, 3]}
    assert body["signatures"][contract.SIGNATURE_BYTES]["inputs"] == {contract.INPUT_BYTES: {"dtype": "string", "shape": [-1]}}


@pytest.mark.end_to_end
def test_tfserving_row_format(real_client, samples, savedmodel):
    images, labels = samples
    response = real_client.post("/v1/models/cifar10:predict", json={"instances": images[:4].tolist()})
    assert response.status_code == 200
    rows = response.get_json()["predictions"]
    assert len(rows) == 4
    for row, image in zip(rows, images[:4]):
        assert set(row) == set(contract.CALIBRATED_OUTPUTS)
        expected = model_probabilities(savedmodel, image)
        assert row[contract.OUTPUT_CLASS_IDS] == int(np.argmax(expected))
        assert row[contract.OUTPUT_CLASS_NAMES] == LABELS[row[contract.OUTPUT_CLASS_IDS]]
        assert row[contract.OUTPUT_PROBABILITIES] == pytest.approx(expected.tolist(), abs=1e-4)
    named = real_client.post(
        "/v1/models/cifar10/versions/1:predict",
        json={"signature_name": "serving_default", "instances": [{contract.INPUT_PIXELS: images[0].tolist()}]},
    )
    assert named.status_code == 200
    (alone,) = named.get_json()["predictions"]
    assert alone[contract.OUTPUT_CLASS_IDS] == rows[0][contract.OUTPUT_CLASS_IDS]
    # A batch of one and a batch of four may differ in the last float bits (oneDNN kernels).
    assert alone[contract.OUTPUT_PROBABILITIES] == pytest.approx(rows[0][contract.OUTPUT_PROBABILITIES], abs=1e-5)


@pytest.mark.end_to_end
def test_tfserving_columnar_format(real_client, samples, savedmodel):
    images, _ = samples
    response = real_client.post("/v1/models/cifar10:predict", json={"inputs": {contract.INPUT_PIXELS: images[:2].tolist()}})
    assert response.status_code == 200
    outputs = response.get_json()["outputs"]
    assert set(outputs) == set(contract.CALIBRATED_OUTPUTS)
    expected = np.stack([model_probabilities(savedmodel, image) for image in images[:2]])
    assert np.asarray(outputs[contract.OUTPUT_PROBABILITIES]) == pytest.approx(expected, abs=1e-4)
    assert outputs[contract.OUTPUT_CLASS_IDS] == expected.argmax(axis=1).tolist()
    assert outputs[contract.OUTPUT_CLASS_NAMES] == [LABELS[c] for c in expected.argmax(axis=1)]
    bare = real_client.post("/v1/models/cifar10:predict", json={"inputs": images[:2].tolist()}).get_json()
    assert bare["outputs"] == outputs


def test_tfserving_rows_and_columns_carry_the_backends_answers(client, samples):
    """Both of TF Serving's JSON layouts hold every output of the backend's answer, in the request's order."""
    images, _ = samples
    expected = fake_backend.expected(images[:4])
    rows = client.post("/v1/models/cifar10:predict", json={"instances": images[:4].tolist()}).get_json()["predictions"]
    columns = client.post("/v1/models/cifar10:predict", json={"inputs": images[:4].tolist()}).get_json()["outputs"]
    assert [set(row) for row in rows] == [set(contract.CALIBRATED_OUTPUTS)] * 4 and set(columns) == set(contract.CALIBRATED_OUTPUTS)
    for key, values in expected.items():
        want = [v.decode() for v in values] if values.dtype == object else values  # class names: strings in JSON
        for got in (np.asarray([row[key] for row in rows]), np.asarray(columns[key])):
            if values.dtype.kind == "f":
                np.testing.assert_allclose(got, want, atol=1e-6, err_msg=key)
            else:
                np.testing.assert_array_equal(got, want, err_msg=key)


def test_tfserving_status_and_metadata(client):
    status = client.get("/v1/models/cifar10").get_json()
    assert status == {
        "model_version_status": [{"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]
    }
    assert client.get("/v1/models/cifar10/versions/1").status_code == 200
    meta = client.get("/v1/models/cifar10/metadata").get_json()
    assert meta["model_spec"] == {"name": "cifar10", "signature_name": "", "version": "1"}
    defs = meta["metadata"]["signature_def"]["signature_def"]
    assert set(defs) == {contract.SIGNATURE_PIXELS, contract.SIGNATURE_BYTES}
    images_input = defs[contract.SIGNATURE_PIXELS]["inputs"][contract.INPUT_PIXELS]
    assert images_input["dtype"] == "DT_UINT8"
    assert [d["size"] for d in images_input["tensor_shape"]["dim"]] == ["-1", "32", "32", "3"]
    assert defs[contract.SIGNATURE_PIXELS]["method_name"] == "tensorflow/serving/predict"


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/v1/models/other"),
        ("get", "/v1/models/cifar10/versions/7"),
        ("get", "/v1/models/cifar10/versions/7/metadata"),
        ("get", "/v1/models/other/metadata"),
        ("post", "/v1/models/other:predict"),
        ("post", "/v1/models/cifar10/versions/2:predict"),
        ("get", "/v1/nothing/here"),
        ("get", "/api/v1/nothing"),
    ],
)
def test_unknown_model_version_or_route_is_json_404(client, samples, method, path):
    response = getattr(client, method)(path, json={"instances": samples[0][:1].tolist()} if method == "post" else None)
    assert response.status_code == 404
    assert response.get_json()["error"]


@pytest.mark.parametrize(
    "body",
    [
        {"instances": [[[1, 2, 3]]]},  # wrong shape
        {"instances": np.zeros((1, 32, 32, 4), np.uint8).tolist()},  # four channels
        {"instances": np.full((1, 32, 32, 3), 0.5).tolist()},  # floats for uint8
        {"instances": np.full((1, 32, 32, 3), 300).tolist()},  # out of the uint8 range
        {"instances": [[["a"] * 3] * 32] * 32},  # strings for uint8
        {"instances": [[1, 2], [3]]},  # ragged
        {"inputs": {"wrong_key": [1]}},
        {"instances": [1], "inputs": [1]},
        {"instances": []},
        {"signature_name": "nope", "instances": [1]},
        {"signature_name": contract.SIGNATURE_BYTES, "instances": [{"b64": "!!!"}]},
        {"signature_name": contract.SIGNATURE_BYTES, "instances": [{"b64": b64(b"not an image")}]},
        {"signature_name": contract.SIGNATURE_BYTES, "instances": [5]},
    ],
    ids=[
        "shape", "channels", "float-dtype", "range", "strings", "ragged", "wrong-key", "both-formats", "empty",
        "signature", "bad-b64", "bytes-not-image", "number-for-string",
    ],
)
def test_tfserving_bad_tensors_are_400(client, body):
    response = client.post("/v1/models/cifar10:predict", json=body)
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["error"]


def test_tfserving_bad_json_is_400(client):
    response = client.post("/v1/models/cifar10:predict", data=b"{nope", content_type="application/json")
    assert response.status_code == 400
    assert "JSON" in response.get_json()["error"]


# -- health, metrics, batching -----------------------------------------------------------


def test_health_and_ready(client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["version"] == 1


def test_not_ready_without_a_model(tmp_path, samples):
    from serve import create_app

    app = create_app({"TESTING": True, "MODEL_DIR": str(tmp_path / "missing"), "MODEL_NAME": "cifar10"})
    app.extensions["serve.backend"].wait_loaded()
    client = app.test_client()
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 503 and "no model versions" in ready.get_json()["error"]
    response = client.post("/api/v1/predict", data=upload(("a.png", png(samples[0][0]))))
    assert response.status_code == 503 and response.get_json()["error"]
    assert client.get("/v1/models/cifar10").status_code == 503


@pytest.mark.end_to_end
def test_concurrent_requests_are_batched(real_app, samples):
    backend = real_app.extensions["serve.backend"]
    before = sum(size * count for size, count in backend.batch_sizes.items() if size > 1)
    data = png(samples[0][0])
    barrier = threading.Barrier(16)
    codes = []

    def one():
        client = real_app.test_client()
        barrier.wait()
        codes.append(client.post("/api/v1/predict", data=upload(("a.png", data))).status_code)

    # The model is held busy until all 16 are waiting, so they must share calls however the threads are
    # scheduled (on a loaded machine they could otherwise each find the model idle and run alone).
    served = backend._served
    batcher = served.loaded[served.default].batcher
    threads = [threading.Thread(target=one) for _ in range(16)]
    with batcher._running:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while batcher.queued < 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert batcher.queued == 16
    for t in threads:
        t.join()
    assert codes == [200] * 16
    batched = sum(size * count for size, count in backend.batch_sizes.items() if size > 1) - before
    assert batched >= 4, dict(backend.batch_sizes)  # several requests shared a model call
    assert max(backend.batch_sizes) <= real_app.extensions["serve.settings"].max_batch
    metrics = real_app.test_client().get("/metrics").data.decode()
    assert "serve_batch_size_bucket" in metrics


def test_metrics_count_routes_and_statuses(client, samples):
    client.post("/api/v1/predict", data=upload(("a.png", png(samples[0][0]))))
    client.post("/api/v1/predict", data=upload(("a.txt", b"text")))
    text = client.get("/metrics").data.decode()
    assert 'serve_requests_total{method="POST",route="/api/v1/predict",status="200"}' in text
    assert 'serve_requests_total{method="POST",route="/api/v1/predict",status="400"}' in text
    assert 'serve_request_duration_seconds_count{method="POST",route="/api/v1/predict"}' in text


# -- the web form (no JavaScript) --------------------------------------------------------


def test_form_page(client):
    page = client.get("/").data.decode()
    assert 'enctype="multipart/form-data"' in page and 'type="file"' in page and "multiple" in page


def test_form_results_show_images_labels_and_errors(client, samples):
    images, _ = samples
    response = client.post("/", data=upload(("first.png", png(images[0])), ("junk.txt", b"junk")))
    assert response.status_code == 200
    page = response.data.decode()
    assert "data:image/png;base64," + b64(png(images[0])) in page
    # Every class name is on the page (three bars); the headline and the bars' order are the model's.
    ranking = [LABELS[c] for c in np.argsort(-fake_probabilities(images[0]), kind="stable")]
    # The headline is the label, or "none of the three classes" for an image the model finds foreign
    # (about one in twenty of the training set's kind, by export's threshold); the bars rank either way.
    assert re.findall(r'data-testid="(?:label|verdict)">([^<]*)<', page) in ([ranking[0]], ["none of the three classes"])
    assert re.findall(r'<span class="name">([^<]*)</span>', page) == ranking
    assert "junk.txt" in page and "not an image" in page
    assert 'class="fill"' in page


def test_form_without_files_says_so(client):
    response = client.post("/", **synthetic.multipart(("", b""), top_k="3"))
    assert response.status_code == 400
    assert b"Choose one or more image files" in response.data
