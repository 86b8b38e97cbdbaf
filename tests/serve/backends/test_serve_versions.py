"""The local backend picks up a new version N+1/ by itself, as TF Serving does."""

import os
import shutil
import time

import pytest

from serve import create_app

#: Every test here needs the model trained and exported in the session (tests/serve/conftest.py).
pytestmark = pytest.mark.end_to_end


def _app_over_a_copy(model_base, models, poll_s):
    shutil.copytree(model_base, models)
    app = create_app({"TESTING": True, "MODEL_DIR": str(models), "MODEL_NAME": "cifar10", "MODEL_POLL_S": poll_s})
    app.extensions["serve.backend"].wait_loaded()
    return app, app.extensions["serve.backend"]


def test_a_new_version_replaces_the_served_one(model_base, tmp_path):
    models = tmp_path / "cifar10"
    app, backend = _app_over_a_copy(model_base, models, poll_s=0.1)
    client = app.test_client()
    try:
        assert client.get("/api/v1/model").get_json()["version"] == 1
        # Publish version 2 the way export does: complete in a hidden folder, then renamed in.
        shutil.copytree(models / "1", models / ".incoming")
        os.rename(models / ".incoming", models / "2")
        deadline = time.monotonic() + 60
        while client.get("/api/v1/model").get_json()["version"] != 2:
            assert time.monotonic() < deadline, "version 2 was never picked up"
            time.sleep(0.2)
        status = client.get("/v1/models/cifar10").get_json()
        # As TF Serving lists them: newest first, the replaced version on its way out.
        states = [(v["version"], v["state"]) for v in status["model_version_status"]]
        assert states[0] == ("2", "AVAILABLE") and states[1][0] == "1" and states[1][1] in ("UNLOADING", "END")
        assert client.get("/v1/models/cifar10/versions/1").status_code == 404  # retired: no longer served
        answer = client.post("/api/v1/predict", json={"instances": [{"b64": _png_b64()}]})
        assert answer.status_code == 200 and answer.get_json()["model"]["version"] == 2
    finally:
        backend.close()


def test_polling_can_be_turned_off(model_base, tmp_path):
    models = tmp_path / "cifar10"
    app, backend = _app_over_a_copy(model_base, models, poll_s=0)
    try:
        shutil.copytree(models / "1", models / "2")
        time.sleep(0.5)
        assert app.test_client().get("/api/v1/model").get_json()["version"] == 1
    finally:
        backend.close()


def _png_b64():
    import base64

    import synthetic

    images, _ = synthetic.make_images(1)
    return base64.b64encode(synthetic.encode(images[0])).decode()


def test_the_published_manifest_is_read_as_the_typed_manifest(model_base, tmp_path):
    from serve.backends import published

    served = published.manifest(str(model_base / "1"))
    assert served.model.name == "seed_cnn" and served.export.version == 1 and served.num_classes == 3
    # A copy whose manifest this code cannot read is refused, never served without the manifest's facts.
    models = tmp_path / "cifar10"
    shutil.copytree(model_base, models)
    (models / "1" / "assets.extra" / "manifest.json").write_text('{"format": 99}')
    app = create_app({"TESTING": True, "MODEL_DIR": str(models), "MODEL_NAME": "cifar10"})
    app.extensions["serve.backend"].wait_loaded()
    try:
        answer = app.test_client().get("/api/v1/model")
        assert answer.status_code == 503
        assert "version 1 is refused" in answer.get_json()["error"] and "manifest format 99" in answer.get_json()["error"]
    finally:
        app.extensions["serve.backend"].close()
