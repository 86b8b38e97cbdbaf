"""The TF Serving backends (REST and gRPC) against the TF Serving stand-in."""

import io
import threading
import time

import numpy as np
import pytest

import contract
import synthetic
from tfserving_standin import tfserving  # noqa: F401  (imported for its fixture)

#: The deadline of the test that TF Serving answers too slowly; the other tests wait TIMEOUT_S.
SHORT_TIMEOUT_S = 1.5
#: Longer than any pause a loaded machine adds (a stand-in's first batches beside a training run took
#: over 1.5 s), far shorter than a request that never ends.
TIMEOUT_S = 30
BACKENDS = ("tfserving-rest", "tfserving-grpc")
HANG_S = 2 * TIMEOUT_S

#: Every test here needs the model trained and exported in the session (tests/serve/conftest.py).
pytestmark = pytest.mark.end_to_end


def _config(kind, standin, model_base, timeout_s=TIMEOUT_S):
    return {
        "TESTING": True,
        "BACKEND": kind,
        "MODEL_NAME": "cifar10",
        "MODEL_DIR": str(model_base),  # only for the manifest (architecture, class names)
        "TFSERVING_REST_URL": standin.rest_url,
        "TFSERVING_GRPC_TARGET": standin.grpc_target,
        "TFSERVING_TIMEOUT_S": timeout_s,
    }


@pytest.fixture(scope="module")
def local_client(model_base):
    from serve import create_app

    app = create_app({"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": "cifar10"})
    app.extensions["serve.backend"].wait_loaded()
    return app.test_client()


@pytest.fixture(scope="module", params=BACKENDS)
def remote(request, tfserving, model_base):  # noqa: F811
    from serve import create_app

    app = create_app(_config(request.param, tfserving, model_base))
    yield request.param, app.test_client(), tfserving
    app.extensions["serve.backend"].close()


def _files(images):
    return {"file": [(io.BytesIO(synthetic.encode(image)), f"{i}.png") for i, image in enumerate(images)]}


def _post_or_hang(client, *args, **kwargs):
    """``(response, seconds)`` of ``client.post``; fails, rather than hanging, if it takes ``HANG_S``."""
    done = {}

    def post():
        started = time.monotonic()
        done["response"] = client.post(*args, **kwargs)
        done["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert "response" in done, f"no answer within {HANG_S} s"
    return done["response"], done["seconds"]


def test_predictions_equal_local(remote, local_client):
    kind, client, _ = remote
    images, _ = synthetic.make_images(3, seed=21)
    ours = client.post("/api/v1/predict", data=_files(images))
    local = local_client.post("/api/v1/predict", data=_files(images))
    assert ours.status_code == local.status_code == 200
    ours, local = ours.get_json(), local.get_json()
    assert ours["model"] == local["model"] == {"name": "cifar10", "version": 1, "architecture": "seed_cnn"}
    for a, b in zip(ours["predictions"], local["predictions"]):
        assert a["label"] == b["label"] and a["class_id"] == b["class_id"]
        assert [t["class_id"] for t in a["top_k"]] == [t["class_id"] for t in b["top_k"]]
        assert a["probability"] == pytest.approx(b["probability"], abs=1e-5)


def test_model_info_and_tfserving_routes(remote, local_client):
    kind, client, _ = remote
    info = client.get("/api/v1/model").get_json()
    local = local_client.get("/api/v1/model").get_json()
    assert info["backend"] == kind
    for key in ("name", "version", "architecture", "class_names", "signatures"):
        assert info[key] == local[key], key
    assert client.get("/readyz").status_code == 200
    assert client.get("/v1/models/cifar10").get_json() == local_client.get("/v1/models/cifar10").get_json()
    images, _ = synthetic.make_images(1, seed=4)
    body = {"signature_name": contract.SIGNATURE_PIXELS, "inputs": {contract.INPUT_PIXELS: images.tolist()}}
    ours = client.post("/v1/models/cifar10/versions/1:predict", json=body)
    theirs = local_client.post("/v1/models/cifar10/versions/1:predict", json=body)
    assert ours.status_code == theirs.status_code == 200
    a, b = ours.get_json()["outputs"], theirs.get_json()["outputs"]
    assert a[contract.OUTPUT_CLASS_NAMES] == b[contract.OUTPUT_CLASS_NAMES]
    assert np.allclose(a[contract.OUTPUT_PROBABILITIES], b[contract.OUTPUT_PROBABILITIES], atol=1e-5)
    bad = client.post("/v1/models/cifar10:predict", json={"instances": [[1, 2, 3]]})
    assert bad.status_code == 400 and bad.get_json()["error"]
    assert client.post("/v1/models/cifar10/versions/9:predict", json=body).status_code == 404


def test_down_gives_503_within_timeout_then_recovers(remote):
    kind, client, standin = remote
    images, _ = synthetic.make_images(1, seed=2)
    assert client.post("/api/v1/predict", data=_files(images[:1])).status_code == 200
    standin.stop()
    try:
        response, _ = _post_or_hang(client, "/api/v1/predict", data=_files(images[:1]))
        assert response.status_code == 503
        assert "TF Serving" in response.get_json()["error"]
        # /readyz answers from a probe at most a second old (serve.health): poll until it has seen it.
        deadline = time.monotonic() + 15
        while (ready := client.get("/readyz")).status_code == 200:
            assert time.monotonic() < deadline, "readiness never noticed that TF Serving went away"
            time.sleep(0.2)
        assert ready.status_code == 503 and ready.get_json()["error"]
    finally:
        standin.start()
    deadline = time.monotonic() + 15
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "did not recover after TF Serving came back"
        time.sleep(0.2)
    assert client.post("/api/v1/predict", data=_files(images[:1])).status_code == 200


@pytest.mark.parametrize("kind", BACKENDS)
def test_slow_tfserving_gives_503_within_timeout(kind, tfserving, model_base):  # noqa: F811
    from serve import create_app

    standin = tfserving
    app = create_app(_config(kind, standin, model_base, timeout_s=SHORT_TIMEOUT_S))
    client = app.test_client()
    images, _ = synthetic.make_images(1, seed=2)
    try:
        calls = standin.predict_calls
        standin.delay_s = HANG_S * 10  # the stand-in would answer only after the test gave up
        try:
            response, seconds = _post_or_hang(client, "/api/v1/predict", data=_files(images[:1]))
        finally:
            standin.delay_s = 0.0
            standin.wake()
        assert standin.predict_calls > calls, "the request reached TF Serving"
        assert response.status_code == 503
        assert f"within {SHORT_TIMEOUT_S:g} s" in response.get_json()["error"]
        assert seconds >= SHORT_TIMEOUT_S * 0.9, "it waited for the deadline, not for something else"
        # It still answers once TF Serving does (a loaded machine may take the short deadline again).
        deadline = time.monotonic() + HANG_S
        while client.post("/api/v1/predict", data=_files(images[:1])).status_code != 200:
            assert time.monotonic() < deadline, "no answer after TF Serving answered again"
    finally:
        app.extensions["serve.backend"].close()


def test_cli_with_grpc_backend_under_gunicorn(tfserving, model_base):  # noqa: F811
    """``python -m serve --backend tfserving-grpc`` under gunicorn: the channel is made in the worker."""
    import requests
    from live_server import start_server, stop_server

    process, url = start_server(
        model_base, args=["--backend", "tfserving-grpc", "--tfserving-grpc-target", tfserving.grpc_target]
    )
    try:
        assert requests.get(f"{url}/api/v1/model", timeout=30).json()["backend"] == "tfserving-grpc"
        images, labels = synthetic.make_images(1, seed=8)
        files = [("file", (f"{i}.png", synthetic.encode(image))) for i, image in enumerate(images)]
        response = requests.post(f"{url}/api/v1/predict", files=files, timeout=30)
        assert response.status_code == 200
        assert len(response.json()["predictions"]) == len(images)
    finally:
        stop_server(process)


@pytest.mark.parametrize("kind", BACKENDS)
def test_large_requests_are_split_to_tfserving_max_batch(kind, tfserving, model_base, local_client):  # noqa: F811
    """TF Serving refuses batches over its max_batch_size; the backends send them in pieces."""
    from serve import create_app

    images, _ = synthetic.make_images(4, seed=31)  # 12 images
    images = images[:10]
    apps = [create_app({**_config(kind, tfserving, model_base), "TFSERVING_MAX_BATCH": n}) for n in (0, 4)]
    unsplit, split = (app.test_client() for app in apps)
    tfserving.max_batch_size = 4
    try:
        refused = unsplit.post("/api/v1/predict", data=_files(images))
        assert refused.status_code == 400, "the stand-in refuses a batch over its maximum"
        assert "Task size 10 is larger than maximum input batch size 4" in refused.get_json()["error"]

        before = len(tfserving.batch_sizes)
        ours = split.post("/api/v1/predict", data=_files(images))
        assert ours.status_code == 200, ours.get_json()
        assert tfserving.batch_sizes[before:] == [4, 4, 2]
        body = {"instances": images.tolist()}
        rows = split.post("/v1/models/cifar10:predict", json=body)
        assert rows.status_code == 200, rows.get_json()
        assert tfserving.batch_sizes[before + 3 :] == [4, 4, 2]
    finally:
        tfserving.max_batch_size = None
        for app in apps:
            app.extensions["serve.backend"].close()
    local = local_client.post("/api/v1/predict", data=_files(images)).get_json()["predictions"]
    got = ours.get_json()["predictions"]
    assert [p["filename"] for p in got] == [f"{i}.png" for i in range(10)]
    assert [p["class_id"] for p in got] == [p["class_id"] for p in local]  # in order, none lost
    assert [p["probability"] for p in got] == pytest.approx([p["probability"] for p in local], abs=1e-5)
    expected = local_client.post("/v1/models/cifar10:predict", json=body).get_json()["predictions"]
    got_rows = rows.get_json()["predictions"]
    assert [r[contract.OUTPUT_CLASS_IDS] for r in got_rows] == [r[contract.OUTPUT_CLASS_IDS] for r in expected]
    assert [r[contract.OUTPUT_CLASS_NAMES] for r in got_rows] == [r[contract.OUTPUT_CLASS_NAMES] for r in expected]
    assert np.allclose(
        [r[contract.OUTPUT_PROBABILITIES] for r in got_rows], [r[contract.OUTPUT_PROBABILITIES] for r in expected], atol=1e-5
    )
