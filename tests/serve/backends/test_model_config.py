"""Several versions and their labels from TF Serving's model config file (serve/backends/model_config.py, read by the
local backend): two versions of ``model_base`` served with ``specific``, labels ``stable`` -> 1 and ``canary``
-> 2, answered by TF Serving's REST API, its gRPC API (``tensorflow-serving-api``'s own stubs) and the Open
Inference Protocol over HTTP and gRPC (``tritonclient``); a label moved in the file moves the traffic
without a restart and without a failed request."""

import os
import shutil
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

import contract
import synthetic
from tensorflow_serving.apis import (get_model_status_pb2, model_service_pb2_grpc, predict_pb2,  # TF Serving's own stubs
                                     prediction_service_pb2_grpc)

from tfs_protos import tensors

MODEL = "cifar10"
#: Seconds a call, or a switch the test waits for, may take: generous, this is no timing test.
DEADLINE_S = 60.0


def config_text(base_path, versions=(1, 2), labels=None, policy=None):
    labels = {"stable": 1, "canary": 2} if labels is None else labels
    policy = policy or "specific { " + " ".join(f"versions: {v}" for v in versions) + " }"
    entries = "".join(f'    version_labels {{ key: "{k}" value: {v} }}\n' for k, v in labels.items())
    return (f'model_config_list {{\n  config {{\n    name: "{MODEL}"\n    base_path: "{base_path}"\n'
            f'    model_platform: "tensorflow"\n    model_version_policy {{ {policy} }}\n{entries}  }}\n}}\n')


def write_config(path, text):
    """Replace the file in one step, as an operator's tooling (or a ConfigMap) does."""
    incoming = path.with_suffix(".incoming")
    incoming.write_text(text)
    os.replace(incoming, path)


@pytest.fixture(scope="module")
def models(model_base, tmp_path_factory):
    """``models/cifar10`` with versions 1 and 2 (2 a copy of 1) and 3 (never in the config)."""
    models = tmp_path_factory.mktemp("versions") / MODEL
    shutil.copytree(model_base, models)
    for version in (2, 3):
        shutil.copytree(models / "1", models / str(version))
    return models


@pytest.fixture(scope="module")
def config_file(models, tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "models.config"
    write_config(path, config_text(models))
    return path


@pytest.fixture(scope="module")
def app(config_file):
    from serve import create_app

    app = create_app({"TESTING": True, "MODEL_CONFIG_FILE": str(config_file), "MODEL_CONFIG_POLL_S": 0.05})
    app.extensions["serve.backend"].wait_loaded()
    yield app
    app.extensions["serve.backend"].close()


@pytest.fixture(scope="module")
def pixels():
    return synthetic.make_images(1, seed=3)[0]


def rest_predict(client, pixels, path):
    response = client.post(f"/v1/models/{MODEL}{path}:predict", json={"instances": pixels.tolist()})
    return response


def grpc_predict(channel, pixels, version=None, label=None):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    # The vendored TensorProto is wire-identical to TensorFlow's: its bytes, without importing TensorFlow's helpers.
    request.inputs[contract.INPUT_PIXELS].ParseFromString(tensors.to_proto(pixels).SerializeToString())
    return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=DEADLINE_S)


# -- the file ------------------------------------------------------------------------------------
@pytest.mark.end_to_end
def test_the_config_names_the_model_and_its_path(app, models):
    settings = app.extensions["serve.settings"]
    assert (settings.model_name, settings.model_dir) == (MODEL, str(models))


@pytest.mark.parametrize("text, reason", [
    ("model_config_list { config { name: 'a' base_path: '/m' } } nonsense", "not a ModelServerConfig"),
    ("model_config_list { config { name: 'a' base_path: '/m' } config { name: 'a' base_path: '/n' } }",
     "Illegal to list model a multiple times"),
    ("model_config_list { config { name: 'a' base_path: '/m' } config { name: 'b' base_path: '/n' } }", "serves one"),
    ("model_config_list { config { name: 'a' } }", "no base_path"),
    ("model_config_list { config { name: 'a' base_path: '/m' model_platform: 'pytorch' } }", "unsupported platform pytorch"),
    ("model_config_list { config { name: 'a' base_path: '/m' model_version_policy { specific {} } } }", "lists no versions"),
    ("model_config_list { config { name: 'a' base_path: '/m' model_version_policy { specific { versions: 1 } } "
     "version_labels { key: 'stable' value: 2 } } }", "label stable to version 2"),
    ("model_config_list { config { name: 'a' base_path: '/m' version_labels { key: '7' value: 1 } } }", "label '7'"),
])
def test_a_config_tf_serving_would_refuse_is_refused_saying_why(text, reason):
    from serve.backends import model_config

    with pytest.raises(model_config.ConfigError, match=reason):
        model_config.parse(text, "models.config")


def test_each_policy_selects_as_tf_serving_does():
    from serve.backends import model_config

    def select(policy, published=(1, 2, 3, 5)):
        return model_config.parse(f"model_config_list {{ config {{ name: 'a' base_path: '/m' "
                                  f"model_version_policy {{ {policy} }} }} }}").select(published)

    assert select("latest {}") == (5,)
    assert select("latest { num_versions: 2 }") == (3, 5)
    assert select("all {}") == (1, 2, 3, 5)
    assert select("specific { versions: 2 versions: 4 }") == (2,)
    assert model_config.newest("a", "/m").select([1, 2]) == (2,)


@pytest.mark.end_to_end
def test_a_label_to_a_missing_version_stops_the_start_with_one_line(models, tmp_path):
    from serve import create_app
    from serve.settings import SettingsError

    path = tmp_path / "models.config"
    write_config(path, config_text(models, versions=(1, 2, 4), labels={"stable": 1, "canary": 4}))
    with pytest.raises(SettingsError, match="label canary to version 4 of model cifar10, which is not currently available"):
        create_app({"TESTING": True, "MODEL_CONFIG_FILE": str(path)})
    check = subprocess.run([sys.executable, "-m", "serve", "--check"], capture_output=True, text=True, timeout=DEADLINE_S,
                           env={**os.environ, "SERVE_MODEL_CONFIG_FILE": str(path)})
    assert check.returncode == 2
    assert check.stderr.strip().count("\n") == 0 and "canary" in check.stderr, check.stderr


# -- routing, on every protocol ------------------------------------------------------------------
@pytest.mark.end_to_end
def test_tf_serving_rest_lists_every_version_and_routes_by_number_and_label(app, pixels):
    client = app.test_client()
    status = client.get(f"/v1/models/{MODEL}").get_json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in status] == [("2", "AVAILABLE"), ("1", "AVAILABLE")]
    for path, version in (("", "2"), ("/versions/1", "1"), ("/versions/2", "2"), ("/labels/stable", "1"),
                          ("/labels/canary", "2")):
        response = rest_predict(client, pixels, path)
        assert response.status_code == 200, response.get_json()
        assert response.headers["X-Model-Version"] == version, path
        assert np.asarray(response.get_json()["predictions"][0]["probabilities"]).shape == (len(synthetic.CLASS_NAMES),)
    assert client.get(f"/v1/models/{MODEL}/labels/canary").get_json()["model_version_status"][0]["version"] == "2"
    assert client.get(f"/v1/models/{MODEL}/labels/stable/metadata").get_json()["model_spec"]["version"] == "1"


@pytest.mark.end_to_end
def test_an_unknown_version_or_label_is_not_found(app, pixels, channel):
    client = app.test_client()
    for path in ("/versions/3", "/versions/7", "/labels/nightly"):
        response = rest_predict(client, pixels, path)
        assert response.status_code == 404, path
        assert response.get_json()["error"] in (f"Servable not found for request: Specific({MODEL}, {path[10:]})",
                                                "Unrecognized servable version label: nightly")
    assert client.get(f"/v1/models/{MODEL}/labels/nightly").status_code == 404
    assert client.post(f"/v2/models/{MODEL}/versions/3/infer", json={}).status_code == 404
    for spec in ({"version": 3}, {"label": "nightly"}):
        with pytest.raises(grpc.RpcError) as raised:
            grpc_predict(channel, pixels, **spec)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND, raised.value.details()


@pytest.mark.end_to_end
def test_tf_serving_grpc_honours_version_and_version_label(channel, pixels):
    for spec, version in (({}, 2), ({"version": 1}, 1), ({"label": "stable"}, 1), ({"label": "canary"}, 2)):
        answer = grpc_predict(channel, pixels, **spec)
        assert answer.model_spec.version.value == version, spec
        probabilities = answer.outputs[contract.OUTPUT_PROBABILITIES]
        assert [d.size for d in probabilities.tensor_shape.dim] == [len(pixels), len(synthetic.CLASS_NAMES)]
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = MODEL
    status = stub.GetModelStatus(request, timeout=DEADLINE_S).model_version_status
    available = get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert [(s.version, s.state) for s in status] == [(2, available), (1, available)]
    request.model_spec.version_label = "stable"
    assert [s.version for s in stub.GetModelStatus(request, timeout=DEADLINE_S).model_version_status] == [1]


@pytest.mark.end_to_end
def test_the_open_inference_protocol_takes_the_version_in_the_path_and_the_call(app, target, pixels):
    client = app.test_client()
    body = {"inputs": [{"name": contract.INPUT_PIXELS, "datatype": "UINT8", "shape": list(pixels.shape),
                        "data": pixels.ravel().tolist()}]}
    for version in ("1", "2"):
        response = client.post(f"/v2/models/{MODEL}/versions/{version}/infer", json=body)
        assert response.status_code == 200 and response.get_json()["model_version"] == version, response.get_json()
        assert client.get(f"/v2/models/{MODEL}/versions/{version}/ready").status_code == 200
    assert client.get(f"/v2/models/{MODEL}").get_json()["versions"] == ["1", "2"]
    triton_client = triton.InferenceServerClient(url=target)
    try:
        tensor = triton.InferInput(contract.INPUT_PIXELS, list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        for version in ("1", "2"):
            result = triton_client.infer(MODEL, [tensor], model_version=version, client_timeout=DEADLINE_S)
            assert result.get_response().model_version == version
        with pytest.raises(InferenceServerException) as raised:
            triton_client.infer(MODEL, [tensor], model_version="3", client_timeout=DEADLINE_S)
        assert raised.value.status() == str(grpc.StatusCode.NOT_FOUND)
    finally:
        triton_client.close()


@pytest.mark.end_to_end
def test_the_answer_metrics_carry_the_version(app, pixels):
    client = app.test_client()
    for path in ("/labels/stable", "/labels/canary"):
        assert rest_predict(client, pixels, path).status_code == 200
    metrics = client.get("/metrics").get_data(as_text=True)
    for version in ("1", "2"):
        assert f'serve_top_probability_count{{version="{version}"}}' in metrics


# -- changing the file ---------------------------------------------------------------------------
@pytest.mark.parametrize("moved", [
    pytest.param({"labels": {"stable": 2, "canary": 2}}, id="to-a-loaded-version"),
    # The new config drops 1 and 2 for 3: 3 is loaded first, then swapped in with the label, then 1 and 2 retire.
    pytest.param({"versions": (3,), "labels": {"stable": 3}}, id="to-a-version-loaded-for-it"),
])
@pytest.mark.end_to_end
def test_moving_a_label_moves_the_traffic_without_a_failed_request(app, config_file, models, channel, pixels, moved):
    """Requests by label run in a loop, over REST and gRPC, while the file moves ``stable`` from 1, and back."""
    stop, failures, seen = threading.Event(), [], []

    def load():
        client = app.test_client()
        while not stop.is_set():
            try:
                response = rest_predict(client, pixels[:1], "/labels/stable")
                if response.status_code != 200:
                    failures.append(("rest", response.status_code, response.get_data(as_text=True)))
                else:
                    seen.append(("rest", int(response.headers["X-Model-Version"])))
                seen.append(("grpc", grpc_predict(channel, pixels[:1], label="stable").model_spec.version.value))
            except Exception as e:  # a failed request is what this test counts
                failures.append(("grpc", type(e).__name__, str(e)))

    def wait_for(version):
        """Until the last REST and the last gRPC answer both came from ``version``."""
        deadline = time.monotonic() + DEADLINE_S
        while len(seen) < 2 or any(answered != version for _, answered in seen[-2:]):
            assert time.monotonic() < deadline, f"the label never moved to version {version}: {seen[-4:]}"
            time.sleep(0.05)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        wait_for(1)
        write_config(config_file, config_text(models, **moved))
        wait_for(moved["labels"]["stable"])
        write_config(config_file, config_text(models))
        wait_for(1)
    finally:
        stop.set()
        worker.join(DEADLINE_S)
    assert not failures, failures[:3]
    # One switch each way: once a request saw the label moved, no later one saw it where it was.
    order = [version for _, version in seen]
    assert order[0] == 1 and order[-1] == 1 and sum(a != b for a, b in zip(order, order[1:])) == 2, order


@pytest.mark.end_to_end
def test_the_versions_a_swap_drops_still_answer_the_moment_it_is_published(app, config_file, models, pixels, monkeypatch):
    """A request that resolved ``stable`` to 1 just before the swap runs just after it: 1 is already among the
    retiring versions (which finish what was sent to them) when the new config is published, with no window."""
    backend = app.extensions["serve.backend"]
    publish, answered = type(backend)._publish, []

    def publish_then_ask(self, *args):
        publish(self, *args)
        try:
            answered.append(self.infer(pixels[:1], 1).version)
        except Exception as e:  # NotServed here was the window
            answered.append(e)

    monkeypatch.setattr(type(backend), "_publish", publish_then_ask)
    write_config(config_file, config_text(models, versions=(3,), labels={"stable": 3}))
    deadline = time.monotonic() + DEADLINE_S
    while not answered:
        assert time.monotonic() < deadline, "the new config was never published"
        backend.info()  # the backend reads the file when asked for a model
        time.sleep(0.05)
    monkeypatch.undo()
    write_config(config_file, config_text(models))
    while backend.info().versions != (1, 2) or backend.info().labels.get("stable") != 1:
        assert time.monotonic() < deadline + DEADLINE_S, "the config was never restored"
        time.sleep(0.05)
    assert answered[:1] == [1], answered


@pytest.mark.parametrize("policy, missing", [
    ("specific { versions: 1 versions: 2 }", 3),  # published, but not in the policy: refused as the file is read
    ("all {}", 4),  # in the policy, but never published: refused once the versions it selects are loaded
])
@pytest.mark.end_to_end
def test_a_new_config_with_a_label_to_a_missing_version_is_refused_and_the_old_one_kept(app, config_file, models, pixels,
                                                                                           caplog, policy, missing):
    client = app.test_client()
    backend = app.extensions["serve.backend"]
    try:
        write_config(config_file, config_text(models, labels={"stable": 1, "canary": missing}, policy=policy))
        deadline = time.monotonic() + DEADLINE_S
        while "model config refused" not in caplog.text:
            assert time.monotonic() < deadline, f"the config with canary -> {missing} was never refused"
            assert rest_predict(client, pixels[:1], "/labels/canary").headers["X-Model-Version"] == "2"
            time.sleep(0.05)
        assert f"label canary to version {missing} of model {MODEL}" in caplog.text
        assert rest_predict(client, pixels[:1], "/labels/canary").headers["X-Model-Version"] == "2"
        assert backend.info().labels == {"stable": 1, "canary": 2}
    finally:
        write_config(config_file, config_text(models))


@pytest.mark.end_to_end
def test_a_new_policy_loads_and_unloads_versions(app, config_file, models, pixels):
    client = app.test_client()

    def states():
        return {s["version"]: s["state"] for s in client.get(f"/v1/models/{MODEL}").get_json()["model_version_status"]}

    try:
        write_config(config_file, config_text(models, labels={}, policy="latest { num_versions: 2 }"))
        deadline = time.monotonic() + DEADLINE_S
        while states().get("3") != "AVAILABLE":
            assert time.monotonic() < deadline, f"version 3 was never loaded: {states()}"
            time.sleep(0.05)
        assert states()["2"] == "AVAILABLE" and states()["1"] in ("UNLOADING", "END")
        assert rest_predict(client, pixels[:1], "/versions/3").headers["X-Model-Version"] == "3"
        assert rest_predict(client, pixels[:1], "/versions/1").status_code == 404
        assert rest_predict(client, pixels[:1], "/labels/stable").status_code == 404
    finally:
        write_config(config_file, config_text(models))
        deadline = time.monotonic() + DEADLINE_S
        while states().get("1") != "AVAILABLE":
            assert time.monotonic() < deadline, "version 1 was never loaded again"
            time.sleep(0.05)
