"""A real gunicorn server (``python -m serve``), exercised over HTTP."""

import base64
import concurrent.futures

import pytest
import requests

import synthetic
from live_server import live_server  # noqa: F401  (imported for its fixture)

#: Every test here needs the model trained and exported in the session (tests/serve/conftest.py).
pytestmark = pytest.mark.end_to_end


def png(array):
    return synthetic.encode(array, "PNG")


def test_live_predict_multipart_and_json(live_server):  # noqa: F811
    images, labels = synthetic.make_images(3, seed=11)
    files = [("file", (f"{i}.png", png(image), "image/png")) for i, image in enumerate(images)]
    response = requests.post(f"{live_server}/api/v1/predict", files=files, timeout=30)
    assert response.status_code == 200
    predictions = response.json()["predictions"]
    assert len(predictions) == len(images)
    right = sum(p["class_id"] == y for p, y in zip(predictions, labels))
    assert right >= 0.6 * len(labels)
    as_json = requests.post(
        f"{live_server}/api/v1/predict",
        json={"instances": [{"b64": base64.b64encode(png(images[0])).decode()}]},
        timeout=30,
    ).json()
    assert as_json["predictions"][0]["class_id"] == predictions[0]["class_id"]


def test_live_errors_are_json_and_server_stays_up(live_server):  # noqa: F811
    bad = requests.post(f"{live_server}/api/v1/predict", files={"file": ("x.txt", b"text")}, timeout=30)
    assert bad.status_code == 400 and "x.txt" in bad.json()["error"]
    big = requests.post(f"{live_server}/api/v1/predict", files={"file": ("x.png", b"\0" * (17 * 1024 * 1024))}, timeout=60)
    assert big.status_code == 413 and big.json()["error"]
    missing = requests.get(f"{live_server}/v1/models/nope", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]
    assert requests.get(f"{live_server}/healthz", timeout=30).status_code == 200


def test_live_tfserving_api_and_info(live_server):  # noqa: F811
    images, _ = synthetic.make_images(1, seed=3)
    response = requests.post(f"{live_server}/v1/models/cifar10:predict", json={"instances": images.tolist()}, timeout=30)
    assert response.status_code == 200 and len(response.json()["predictions"]) == len(images)
    info = requests.get(f"{live_server}/api/v1/model", timeout=30).json()
    assert info["backend"] == "local" and info["version"] == 1 and info["architecture"] == "seed_cnn"


def test_live_concurrent_requests_batch_and_metrics(live_server):  # noqa: F811
    data = png(synthetic.make_images(1, seed=5)[0][0])

    def one(_):
        return requests.post(f"{live_server}/api/v1/predict", files={"file": ("a.png", data)}, timeout=60).status_code

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert list(pool.map(one, range(64))) == [200] * 64
    metrics = requests.get(f"{live_server}/metrics", timeout=30)
    assert metrics.status_code == 200
    text = metrics.text
    assert 'serve_requests_total{method="POST",route="/api/v1/predict",status="200"}' in text
    assert "serve_request_duration_seconds_bucket" in text
    # The batch-size histogram (multiprocess mode under gunicorn) saw batches bigger than one.
    count = _sample(text, "serve_batch_size_count")
    total = _sample(text, "serve_batch_size_sum")
    assert count and total > count, (count, total)


def _sample(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None
