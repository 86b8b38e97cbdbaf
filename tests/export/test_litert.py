"""LiteRT: export writes and checks the float32 and int8 models; the server runs them, with and without TensorFlow."""

import base64
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import requests

import contract
import synthetic
from contract import published as publications
from live_server import start_server, stop_server
from runs import copy_run

RUNTIMES = ("litert", "litert-int8", "savedmodel")


def published(version_dir):
    """The published manifest's LiteRT checks (a contract.published.LiteRT)."""
    return publications.read_published(str(version_dir / contract.ASSETS_EXTRA / contract.MANIFEST_FILE)).export.litert


def sample_images(trained_run):
    """The run's test sample (what export checked the models on) and its labels."""
    with np.load(trained_run / contract.SAMPLES_FILE) as data:
        return data["test_images"], data["test_labels"]


def savedmodel_probabilities(version_dir, images):
    import tensorflow as tf

    signature = tf.saved_model.load(str(version_dir)).signatures[contract.SIGNATURE_PIXELS]
    return signature(images=tf.constant(images))[contract.OUTPUT_PROBABILITIES].numpy()


def litert_outputs(path, images):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner(contract.SIGNATURE_PIXELS)
    return runner(images=images)


# -- export ---------------------------------------------------------------------------------


def test_export_writes_both_models_and_records_their_checks(model_base, trained_run):
    from export import litert

    version = model_base / "1"
    report = published(version)
    images, labels = sample_images(trained_run)
    assert report.checked_on.images == len(images)
    checks = report.runtimes
    for runtime, file in (("litert", contract.LITERT_FILE), ("litert-int8", contract.LITERT_INT8_FILE)):
        check = checks[runtime]
        assert check.published is True and check.file == file and (version / file).is_file()
        assert check.bytes == (version / file).stat().st_size
    assert checks["litert"].agreement == 1.0 and checks["litert"].max_abs_diff <= litert.FLOAT_TOLERANCE
    assert checks["litert-int8"].agreement >= litert.AGREEMENT_GATE
    assert checks["litert-int8"].calibration is None  # dynamic-range quantization calibrates nothing
    # The recorded numbers are what the published files do, re-measured here.
    expected = savedmodel_probabilities(version, images)
    assert report.savedmodel_accuracy == pytest.approx(np.mean(expected.argmax(1) == labels))
    for runtime in ("litert", "litert-int8"):
        got = litert_outputs(version / checks[runtime].file, images)
        assert np.mean(got["probabilities"].argmax(1) == expected.argmax(1)) == pytest.approx(checks[runtime].agreement)
        assert checks[runtime].accuracy == pytest.approx(np.mean(got["probabilities"].argmax(1) == labels))
    # The float model has the SavedModel's whole serving_default signature, class names included.
    got = litert_outputs(version / contract.LITERT_FILE, images)
    assert got["class_ids"].tolist() == expected.argmax(1).tolist()
    assert [n.decode() for n in got["class_names"]] == [synthetic.CLASS_NAMES[i] for i in expected.argmax(1)]


def test_the_int8_model_has_int8_kernels_and_answers_each_image_as_if_alone(model_base, trained_run):
    from tensorflow.lite.tools import flatbuffer_utils

    content = (model_base / "1" / contract.LITERT_INT8_FILE).read_bytes()
    model = flatbuffer_utils.convert_bytearray_to_object(content)
    graph = model.subgraphs[0]
    float32, int8 = 0, 9  # tflite schema TensorType
    kernels = []
    for op in graph.operators:
        if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) in ("CONV_2D", "FULLY_CONNECTED"):
            inputs, kernel = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
            kernels.append((int(np.prod(kernel.shape)), inputs.type, kernel.type))
    # seed_cnn's layers: float activations in, int8 kernels, but for its first convolution's 864 weights,
    # under the converter's 1,024.
    assert len(kernels) == 6 and all(given == float32 for _, given, _ in kernels), kernels
    assert [kind for size, _, kind in kernels] == [int8 if size >= 1024 else float32 for size, _, _ in kernels]
    assert sorted(kind for _, _, kind in kernels) == [float32] + [int8] * 5
    # Each layer's input is quantized from its own image: an image's answer is the same in any batch, up to
    # float32 summation order (quantized with its batch, it would move with its neighbours' ranges).
    images, _ = sample_images(trained_run)
    batch = litert_outputs(model_base / "1" / contract.LITERT_INT8_FILE, images[:16])
    for i in (0, 7, 15):
        alone = litert_outputs(model_base / "1" / contract.LITERT_INT8_FILE, images[i:i + 1])
        np.testing.assert_allclose(alone["probabilities"][0], batch["probabilities"][i], rtol=0, atol=1e-6)
    assert batch["class_ids"].tolist() == batch["probabilities"].argmax(1).tolist()


def test_the_gate_refuses_an_int8_model_that_gives_other_classes(trained_run, tmp_path, monkeypatch, capsys):
    import tensorflow as tf

    from export import exporter, litert

    def calibrated_on_black_images(saved_model_dir):
        """Full-integer int8 calibrated on black images: every activation range is [0, 0], so real images saturate it."""
        converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, signature_keys=[contract.SIGNATURE_PIXELS])
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: iter([{contract.INPUT_PIXELS: np.zeros((8, 32, 32, 3), np.uint8)}])
        return converter.convert()

    monkeypatch.setattr(litert, "convert_int8", calibrated_on_black_images)
    version = exporter.run(run_dir=str(trained_run), model_dir=str(tmp_path / "models"), name="cifar10", verbose=0)
    report = published(Path(version)).runtimes
    assert report["litert-int8"].published is False
    refused = report["litert-int8"]
    assert refused.agreement < litert.AGREEMENT_GATE
    assert refused.reason == litert.int8_refusal(refused.agreement, refused.images)
    assert not os.path.exists(os.path.join(version, contract.LITERT_INT8_FILE))
    # The rest is published as usual.
    assert report["litert"].published is True
    assert os.path.isfile(os.path.join(version, contract.LITERT_FILE))
    assert os.path.isfile(os.path.join(version, "saved_model.pb"))
    (line,) = [line for line in capsys.readouterr().err.splitlines() if contract.LITERT_INT8_FILE in line]
    assert line == f"warning: {contract.LITERT_INT8_FILE} (litert-int8) not published: {refused.reason}"
    assert f"{refused.agreement:.2%} of {refused.images} test images" in line and "under the 99.0% gate" in line


@pytest.mark.parametrize("agreeing, images, published", [
    (1000, 1000, True), (990, 1000, True),  # the serving target, met exactly
    (989, 1000, False), (47, 48, False),  # one image under it; one of a small sample
])
def test_the_int8_gate_is_the_99_percent_target(agreeing, images, published):
    from export import litert

    reason = litert.int8_refusal(agreeing / images, images)
    assert (reason is None) == published
    if not published:
        assert reason == (f"it gives the SavedModel's class on {agreeing / images:.2%} of {images} test images, "
                          "under the 99.0% gate")


def test_a_version_whose_int8_model_was_calibrated_still_reads(model_base, tmp_path):
    import json

    # Versions exported with full-integer int8 recorded what it was calibrated on; their manifests still read.
    version = tmp_path / "1"
    shutil.copytree(model_base / "1", version)
    path = version / contract.ASSETS_EXTRA / contract.MANIFEST_FILE
    calibration = {"images": 500, "source": "samples.npz train_images",
                   "float_ops": ["FULLY_CONNECTED", "SOFTMAX", "ARG_MAX"], "float_layers": ["bn2", "conv2a"]}
    manifest = json.loads(path.read_text())
    manifest["export"]["litert"]["runtimes"]["litert-int8"]["calibration"] = calibration
    path.write_text(json.dumps(manifest))
    assert published(version).runtimes["litert-int8"].calibration == publications.Int8Calibration(**calibration)


def test_a_run_whose_samples_are_not_the_manifests_is_refused(trained_run, tmp_path, capsys):
    from export import exporter

    run = copy_run(trained_run, tmp_path / "run")
    with np.load(run / contract.SAMPLES_FILE) as data:
        samples = dict(data)
    np.savez(run / contract.SAMPLES_FILE, **{**samples, "test_labels": samples["test_labels"][::-1]})
    assert exporter.main(["--run", str(run), "--model-dir", str(tmp_path / "models"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not the file the run's manifest describes (sha256 differs)" in err
    assert not (tmp_path / "models" / "cifar10").exists()


# -- serving on every runtime -----------------------------------------------------------------


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime_app(request, model_base):
    from serve import create_app

    app = create_app({"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": "cifar10", "RUNTIME": request.param})
    app.extensions["serve.backend"].wait_loaded()
    yield request.param, app
    app.extensions["serve.backend"].close()


def test_every_route_answers_on_each_runtime(runtime_app, trained_run):
    runtime, app = runtime_app
    client = app.test_client()
    images, _ = sample_images(trained_run)
    pngs = [synthetic.encode(image) for image in images[:20]]  # 20: the many-image decode path too

    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz").get_json()
    assert ready["status"] == "ready" and ready["runtime"] == runtime
    info = client.get("/api/v1/model").get_json()
    assert info["runtime"] == runtime and info["version"] == 1
    assert set(info["signatures"]) == {contract.SIGNATURE_PIXELS, contract.SIGNATURE_BYTES}

    multipart = client.post("/api/v1/predict", **synthetic.multipart(*[(f"{i}.png", d) for i, d in enumerate(pngs)]))
    assert multipart.status_code == 200
    labels = [p["class_id"] for p in multipart.get_json()["predictions"]]
    as_json = client.post("/api/v1/predict", json={"instances": [{"b64": base64.b64encode(pngs[0]).decode()}]})
    assert as_json.status_code == 200 and as_json.get_json()["predictions"][0]["class_id"] == labels[0]
    page = client.post("/", **synthetic.multipart(("a.png", pngs[0])))
    assert page.status_code == 200 and f"{runtime} runtime" in page.get_data(as_text=True)

    assert client.get("/v1/models/cifar10").get_json()["model_version_status"][0]["state"] == "AVAILABLE"
    metadata = client.get("/v1/models/cifar10/metadata").get_json()
    assert set(metadata["metadata"]["signature_def"]["signature_def"]) == {contract.SIGNATURE_PIXELS, contract.SIGNATURE_BYTES}
    pixels = client.post("/v1/models/cifar10:predict", json={"instances": images[:3].tolist()})
    assert pixels.status_code == 200
    assert [row["class_ids"] for row in pixels.get_json()["predictions"]] == labels[:3]
    encoded = client.post("/v1/models/cifar10:predict", json={
        "signature_name": contract.SIGNATURE_BYTES,
        "instances": [{"b64": base64.b64encode(d).decode()} for d in pngs[:3]]})
    assert encoded.status_code == 200
    assert [row["class_ids"] for row in encoded.get_json()["predictions"]] == labels[:3]
    bad = client.post("/v1/models/cifar10:predict", json={
        "signature_name": contract.SIGNATURE_BYTES, "instances": [{"b64": base64.b64encode(b"not an image").decode()}]})
    assert bad.status_code == 400 and bad.get_json()["error"]
    empty = client.post("/v1/models/cifar10:predict", json={"signature_name": contract.SIGNATURE_BYTES, "inputs": []})
    assert empty.status_code == 200
    assert empty.get_json()["outputs"] == {"probabilities": [], "class_ids": [], "class_names": [], "ood_score": [],
                                           "in_distribution": []}

    metrics = client.get("/metrics").get_data(as_text=True)
    assert f'serve_model{{runtime="{runtime}",version="1"}} 1.0' in metrics


def test_float_runtimes_give_the_savedmodels_labels(model_base, trained_run):
    """The same test images through the server on each float runtime: the same labels, nearly the same probabilities."""
    from serve import create_app

    images, _ = sample_images(trained_run)
    body = synthetic.multipart(*[(f"{i}.png", synthetic.encode(image)) for i, image in enumerate(images)])
    answers = {}
    for runtime in ("savedmodel", "litert"):
        app = create_app({"TESTING": True, "MODEL_DIR": str(model_base), "RUNTIME": runtime, "TOP_K": 3})
        app.extensions["serve.backend"].wait_loaded()
        try:
            answers[runtime] = app.test_client().post("/api/v1/predict", **body).get_json()["predictions"]
        finally:
            app.extensions["serve.backend"].close()
    assert [p["class_id"] for p in answers["litert"]] == [p["class_id"] for p in answers["savedmodel"]]
    for lite, saved in zip(answers["litert"], answers["savedmodel"]):
        assert [t["class_id"] for t in lite["top_k"]] == [t["class_id"] for t in saved["top_k"]]
        assert [t["probability"] for t in lite["top_k"]] == pytest.approx([t["probability"] for t in saved["top_k"]], abs=1e-4)


def test_a_runtime_without_its_model_says_why(model_base, tmp_path):
    from serve import create_app

    models = tmp_path / "cifar10"
    shutil.copytree(model_base, models)
    os.remove(models / "1" / contract.LITERT_INT8_FILE)
    app = create_app({"TESTING": True, "MODEL_DIR": str(models), "RUNTIME": "litert-int8"})
    app.extensions["serve.backend"].wait_loaded()
    answer = app.test_client().get("/readyz")
    assert answer.status_code == 503
    assert contract.LITERT_INT8_FILE in answer.get_json()["error"]


def test_an_unknown_runtime_is_refused(model_base):
    from serve import create_app

    with pytest.raises(ValueError, match="litert, litert-int8, savedmodel"):
        create_app({"TESTING": True, "MODEL_DIR": str(model_base), "RUNTIME": "onnx"})


# -- the serving install without TensorFlow ---------------------------------------------------

BLOCKER = textwrap.dedent('''
    """Make ``import tensorflow`` (and TF Serving's protos, which need it) fail, as in a serve-only install."""
    import sys

    class _NoTensorFlow:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "tensorflow_serving", "keras", "tf_keras"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, _NoTensorFlow())
''')


def test_without_tensorflow_gunicorn_serves_the_litert_model(model_base, tmp_path, trained_run):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
           "SERVE_RUNTIME": "litert", "WEB_CONCURRENCY": "1"}
    blocked = subprocess.run([sys.executable, "-c", "import tensorflow"], env={**os.environ, **env},
                             capture_output=True, text=True)
    assert blocked.returncode != 0 and "blocked by the test" in blocked.stderr

    process, url = start_server(model_base, extra_env=env)
    try:
        images, _ = sample_images(trained_run)
        pngs = [synthetic.encode(image) for image in images[:20]]
        files = [("file", (f"{i}.png", data, "image/png")) for i, data in enumerate(pngs)]
        answer = requests.post(f"{url}/api/v1/predict", files=files, timeout=30)
        assert answer.status_code == 200 and len(answer.json()["predictions"]) == 20
        labels = [p["class_id"] for p in answer.json()["predictions"]]
        encoded = requests.post(f"{url}/v1/models/cifar10:predict", timeout=30, json={
            "signature_name": contract.SIGNATURE_BYTES,
            "instances": [{"b64": base64.b64encode(d).decode()} for d in pngs[:4]]})
        assert encoded.status_code == 200 and [r["class_ids"] for r in encoded.json()["predictions"]] == labels[:4]
        assert requests.get(f"{url}/v1/models/cifar10/metadata", timeout=30).status_code == 200
        assert requests.get(f"{url}/api/v1/model", timeout=30).json()["runtime"] == "litert"
        assert 'serve_model{runtime="litert",version="1"} 1.0' in requests.get(f"{url}/metrics", timeout=30).text
    finally:
        stop_server(process)
