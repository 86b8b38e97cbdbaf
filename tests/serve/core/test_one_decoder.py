"""One decoder, one core: an image gets the same answer on every route, runtime and backend, and
moves every per-image metric by exactly one whichever route it came by.

Every encoded image that reaches the server is decoded by ``serve/core/decode.py`` (EXIF orientation,
Pillow's BILINEAR resize, the pixel cap); runtimes and TF Serving receive pixels. The images here
are the ones where two decoders part ways: a JPEG whose EXIF block turns it, and a 640x480 PNG.
"""

import base64
import io
import re

import numpy as np
import pytest
from PIL import Image

import contract
import synthetic
from live_server import live_server  # noqa: F401  (imported for its fixture)
from tfserving_standin import tfserving  # noqa: F401  (imported for its fixture)
from serve.settings import DEFAULT_MAX_PIXELS

RUNTIMES = ("litert", "litert-int8", "savedmodel")
REMOTE = ("tfserving-rest", "tfserving-grpc")


def _rotated_jpeg():
    """A 48x32 photo-like JPEG with EXIF orientation 6: upright it is 32x48, turned a quarter."""
    rng = np.random.default_rng(11)
    base = np.zeros((32, 48, 3), np.uint8)
    base[:, :24] = (220, 40, 40)  # left half red, right half a noisy blue: the turn moves them
    base[:, 24:] = np.clip(rng.normal((30, 60, 200), 25, (32, 24, 3)), 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    Image.fromarray(base).save(out, "JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def _large_png():
    """640x480 with detail a resize must filter."""
    y, x = np.mgrid[0:480, 0:640]
    stripes = ((x // 3 + y // 5) % 2 * 200).astype(np.uint8)
    picture = np.stack([stripes, np.roll(stripes, 7, axis=1), (x * 255 // 640).astype(np.uint8)], axis=-1)
    return synthetic.encode(picture, "PNG")


IMAGES = {"rotated-jpeg": _rotated_jpeg(), "640x480-png": _large_png()}


def test_the_images_are_ones_where_decoders_differ():
    """Without EXIF the JPEG's pixels would not be the server's, and the PNG must be resized: the test below means something."""
    from serve.core import decode as images

    turned, _ = images.decode(IMAGES["rotated-jpeg"], DEFAULT_MAX_PIXELS)
    plain = np.asarray(Image.open(io.BytesIO(IMAGES["rotated-jpeg"])).convert("RGB").resize((32, 32), Image.BILINEAR))
    assert np.abs(turned.astype(int) - plain.astype(int)).mean() > 20
    assert Image.open(io.BytesIO(IMAGES["640x480-png"])).size == (640, 480)


#: The metrics every image answered moves by one, whichever route it came by (serve.core.service).
PER_IMAGE = ("serve_images_total", "serve_top_probability_count", "serve_ood_score_count")


def _per_image(client):
    registry = client.application.extensions["serve.metrics"]._registry
    return {name: sum(s.value for m in registry.collect() for s in m.samples if s.name == name) for name in PER_IMAGE}


def _answers(client, data):
    """``{route: probabilities}`` for ``data`` sent by every route, encoded or as the server's own pixels.

    Each route must move every per-image metric by exactly one.
    """
    b64 = base64.b64encode(data).decode()
    pixels = _pixels(data).tolist()
    routes = {
        "api-multipart": lambda: client.post("/api/v1/predict?top_k=10", **synthetic.multipart(("x.img", data))),
        "api-json": lambda: client.post("/api/v1/predict?top_k=10", json={"instances": [{"b64": b64}]}),
        "v1-rows": lambda: client.post("/v1/models/cifar10:predict", json={"signature_name": contract.SIGNATURE_BYTES,
                                                                          "instances": [{"b64": b64}]}),
        "v1-columns": lambda: client.post("/v1/models/cifar10:predict", json={
            "signature_name": contract.SIGNATURE_BYTES, "inputs": {"image_bytes": [{"b64": b64}]}}),
        "v1-pixels": lambda: client.post("/v1/models/cifar10:predict", json={"instances": [pixels]}),
        "v2": lambda: client.post("/v2/models/cifar10/infer", json={"inputs": [{
            "name": "image_bytes", "datatype": "BYTES", "shape": [1], "parameters": {"content_type": "base64"}, "data": [b64]}],
            "outputs": [{"name": "probabilities"}]}),
        "v2-pixels": lambda: client.post("/v2/models/cifar10/infer", json={"inputs": [{
            "name": "images", "datatype": "UINT8", "shape": [1, 32, 32, 3], "data": np.ravel(pixels).tolist()}],
            "outputs": [{"name": "probabilities"}]}),
        # top_k=1: the one bar is the model's class, whether the headline is the label or the foreign-image verdict.
        "form-label": lambda: client.post("/", data={"top_k": "1", "file": (io.BytesIO(data), "x.img")},
                                          content_type="multipart/form-data"),
    }
    read = {
        "api-multipart": lambda r: _from_top_k(r.get_json()["predictions"][0]),
        "api-json": lambda r: _from_top_k(r.get_json()["predictions"][0]),
        "v1-rows": lambda r: np.array(r.get_json()["predictions"][0]["probabilities"]),
        "v1-columns": lambda r: np.array(r.get_json()["outputs"]["probabilities"][0]),
        "v1-pixels": lambda r: np.array(r.get_json()["predictions"][0]["probabilities"]),
        "v2": lambda r: np.array(r.get_json()["outputs"][0]["data"]),
        "v2-pixels": lambda r: np.array(r.get_json()["outputs"][0]["data"]),
        "form-label": lambda r: re.search(r'<span class="name">([^<]+)</span>', r.get_data(as_text=True)).group(1).strip(),
    }
    answers = {}
    for route, send in routes.items():
        before = _per_image(client)
        answer = send()
        assert answer.status_code == 200, (route, answer.get_data(as_text=True)[:300])
        after = _per_image(client)
        assert {k: after[k] - before[k] for k in PER_IMAGE} == dict.fromkeys(PER_IMAGE, 1), route
        answers[route] = read[route](answer)
    return answers


def _pixels(data):
    from serve.core import decode

    return decode.decode(data, DEFAULT_MAX_PIXELS)[0]


def _from_top_k(prediction):
    probabilities = np.zeros(len(prediction["top_k"]))
    for entry in prediction["top_k"]:
        probabilities[entry["class_id"]] = entry["probability"]
    return probabilities


def _check_routes_agree(answers, class_names):
    reference = answers["api-multipart"]
    for route, probabilities in answers.items():
        if route == "form-label":
            assert probabilities == class_names[int(np.argmax(reference))], route
        else:
            np.testing.assert_allclose(probabilities, reference, atol=1e-6, err_msg=route)
    return reference


@pytest.fixture(scope="module")
def class_names(trained_run):
    from contract import MANIFEST_FILE, manifest

    return list(manifest.read(trained_run / MANIFEST_FILE).class_names)


@pytest.fixture(scope="module", params=RUNTIMES + REMOTE)
def served(request, model_base, tfserving):  # noqa: F811
    from serve import create_app

    config = {"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": "cifar10"}
    if request.param in RUNTIMES:
        config["RUNTIME"] = request.param
    else:
        config.update(BACKEND=request.param, TFSERVING_REST_URL=tfserving.rest_url, TFSERVING_GRPC_TARGET=tfserving.grpc_target)
    app = create_app(config)
    if request.param in RUNTIMES:
        app.extensions["serve.backend"].wait_loaded()
    yield request.param, app.test_client()
    app.extensions["serve.backend"].close()


_seen = {}


@pytest.mark.end_to_end
@pytest.mark.parametrize("name", IMAGES)
def test_every_route_gives_the_same_answer(served, name, class_names):
    where, client = served
    reference = _check_routes_agree(_answers(client, IMAGES[name]), class_names)
    _seen[(where, name)] = reference
    # The float runtimes and TF Serving (which runs the SavedModel) agree with one another too.
    others = [_seen[(w, name)] for w in ("litert", "savedmodel", *REMOTE) if (w, name) in _seen and w != where]
    if where != "litert-int8":
        for other in others:
            np.testing.assert_allclose(reference, other, atol=1e-4)


@pytest.mark.end_to_end
@pytest.mark.parametrize("name", IMAGES)
def test_the_client_gets_one_answer_on_every_transport(name, live_server, tfserving, tmp_path, capsys):  # noqa: F811
    """Straight to TF Serving the client decodes by the server's rule, so it agrees with the front end."""
    import json

    from client import cli

    path = tmp_path / ("photo.jpg" if name.endswith("jpeg") else "photo.png")
    path.write_bytes(IMAGES[name])
    urls = {"api": live_server, "v2": live_server, "tfserving-rest": tfserving.rest_url, "tfserving-grpc": tfserving.grpc_target}
    answers = {}
    for via, url in urls.items():
        assert cli.main(["predict", str(path), "--via", via, "--url", url, "--json", "--top-k", "10"]) == 0
        (line,) = capsys.readouterr().out.splitlines()
        result = json.loads(line)
        answers[via] = (result["class_id"], {t["class_id"]: t["probability"] for t in result["top_k"]},
                        result["ood_score"], result["in_distribution"])
    reference_class, reference, reference_score, reference_verdict = answers["api"]
    assert isinstance(reference_score, float) and isinstance(reference_verdict, bool)
    for via, (class_id, probabilities, score, verdict) in answers.items():
        assert class_id == reference_class, via
        for c, p in reference.items():
            assert probabilities[c] == pytest.approx(p, abs=1e-4), via
        # How foreign the image looks, the same on every transport (TF Serving runs the same graph).
        assert score == pytest.approx(reference_score, abs=1e-4) and verdict == reference_verdict, via
