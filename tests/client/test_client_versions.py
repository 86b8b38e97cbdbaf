"""The client against this project's server with two versions and their labels (a TF Serving model config):
``--via grpc`` (TF Serving's gRPC API on the server's gRPC port) and ``--via v2-grpc`` with the API key in the
call's metadata, and ``--version`` / ``--version-label`` on every transport that has them. Which version
answered is read from the server's own metrics of the answers, by version."""

import re
import shutil
import threading

import pytest

import grpc_servers
import synthetic
from client import cli

KEY = "client-versions-key"
MODEL = "cifar10"
CONFIG = """model_config_list {{
  config {{
    name: "cifar10"
    base_path: "{base_path}"
    model_platform: "tensorflow"
    model_version_policy {{ specific {{ versions: 1 versions: 2 }} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 2 }}
  }}
}}
"""


@pytest.fixture(scope="module")
def app(model_base, tmp_path_factory):
    from serve import create_app

    root = tmp_path_factory.mktemp("client-versions")
    models = root / MODEL
    shutil.copytree(model_base, models)
    shutil.copytree(models / "1", models / "2")
    (root / "models.config").write_text(CONFIG.format(base_path=models))
    app = create_app({"TESTING": True, "MODEL_CONFIG_FILE": str(root / "models.config"), "API_KEYS": KEY})
    app.extensions["serve.backend"].wait_loaded()
    yield app
    app.extensions["serve.backend"].close()


@pytest.fixture(scope="module")
def urls(app):
    """``{via: address}`` of the app served over HTTP (a thread) and gRPC (its server, as each worker starts it)."""
    from werkzeug.serving import make_server

    http = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{http.server_port}"
    with grpc_servers.serving(app) as target:
        yield {"api": url, "tfserving-rest": url, "v2": url, "grpc": target, "tfserving-grpc": target, "v2-grpc": target}
    http.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    images, _ = synthetic.make_images(1, seed=9)
    paths = []
    for i, image in enumerate(images):
        paths.append(str(folder / f"{i}.png"))
        with open(paths[-1], "wb") as f:
            f.write(synthetic.encode(image))
    return paths


def answered(app):
    """``{version: images answered}`` from the server's ``serve_top_probability`` histogram."""
    text = app.test_client().get("/metrics", headers={"X-API-Key": KEY}).get_data(as_text=True)
    return {v: float(n) for v, n in re.findall(r'serve_top_probability_count\{version="(\d+)"\} (\S+)', text)}


def predict(capsys, urls, via, *args, key=KEY):
    import json

    code = cli.main(["predict", *args, "--via", via, "--url", urls[via], "--json", "--timeout", "60",
                     *(["--api-key", key] if key else [])])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


@pytest.mark.parametrize("via, which, version", [
    ("grpc", [], "2"),
    ("grpc", ["--version", "1"], "1"),
    ("grpc", ["--version-label", "stable"], "1"),
    ("tfserving-grpc", ["--version-label", "canary"], "2"),
    ("tfserving-rest", ["--version", "1"], "1"),
    ("tfserving-rest", ["--version-label", "stable"], "1"),
    ("v2", ["--version", "1"], "1"),
    ("v2-grpc", [], "2"),
    ("v2-grpc", ["--version", "1"], "1"),
])
def test_each_transport_asks_the_version_it_names(app, urls, files, capsys, via, which, version):
    before = answered(app)
    code, results, err = predict(capsys, urls, via, *files, *which)
    assert code == 0, err
    assert len(results) == len(files) and all(r["label"] in synthetic.CLASS_NAMES for r in results)
    after = answered(app)
    moved = {v: after.get(v, 0) - before.get(v, 0) for v in ("1", "2")}
    assert moved == {version: len(files), ("1" if version == "2" else "2"): 0}


@pytest.mark.parametrize("via", ["grpc", "v2-grpc"])
def test_grpc_gives_the_api_s_answers(app, urls, files, capsys, via):
    code, api, err = predict(capsys, urls, "api", *files)
    assert code == 0, err
    code, results, err = predict(capsys, urls, via, *files, "--top-k", "3")
    assert code == 0, err
    assert [(r["file"], r["label"], r["class_id"]) for r in results] == [(r["file"], r["label"], r["class_id"]) for r in api]
    for mine, theirs in zip(results, api):
        assert mine["probability"] == pytest.approx(theirs["probability"], abs=1e-5)
        assert mine["ood_score"] == pytest.approx(theirs["ood_score"], abs=1e-4)
        assert mine["in_distribution"] == theirs["in_distribution"]
        assert [t["class_id"] for t in mine["top_k"]] == [t["class_id"] for t in theirs["top_k"]]


@pytest.mark.parametrize("via", ["grpc", "v2-grpc"])
def test_grpc_without_the_key_is_a_usage_error_naming_it(urls, files, capsys, via):
    code, _, err = predict(capsys, urls, via, *files, key=None)
    assert code == cli.EXIT_USAGE and "UNAUTHENTICATED" in err and "--api-key" in err


@pytest.mark.parametrize("via, which, says", [
    ("grpc", ["--version-label", "nightly"], "Unrecognized servable version label: nightly"),
    ("tfserving-rest", ["--version", "7"], "Servable not found for request: Specific(cifar10, 7)"),
    ("v2-grpc", ["--version", "7"], "has no version '7'"),
])
def test_an_unknown_version_or_label_fails_saying_so(urls, files, capsys, via, which, says):
    code, _, err = predict(capsys, urls, via, files[0], *which)
    assert code == cli.EXIT_FAILED and says in err, err


@pytest.mark.parametrize("via, which", [("api", ["--version", "1"]), ("v2", ["--version-label", "stable"]),
                                        ("v2-grpc", ["--version-label", "stable"])])
def test_a_version_the_transport_cannot_name_is_a_usage_error(urls, files, capsys, via, which):
    code, _, err = predict(capsys, urls, via, files[0], *which)
    assert code == cli.EXIT_USAGE and "--version" in err and err.count("\n") == 1, err


def test_version_and_label_together_are_refused(files, capsys):
    assert cli.main(["predict", files[0], "--version", "1", "--version-label", "stable"]) == cli.EXIT_USAGE
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("via", ["grpc", "v2-grpc"])
def test_health_and_info_over_grpc(urls, capsys, via):
    assert cli.main(["health", "--via", via, "--url", urls[via], "--api-key", KEY]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ready:") and "2" in out
    assert cli.main(["info", "--via", via, "--url", urls[via], "--api-key", KEY, "--json"]) == 0
    import json

    info = json.loads(capsys.readouterr().out)
    assert info["name"] == MODEL and int(info["version"]) == 2


def test_the_key_goes_in_the_metadata_of_every_grpc_call():
    from client import transports

    for transport in (transports.TFServingGrpcTransport("127.0.0.1:1", MODEL, 1.0), transports.V2GrpcTransport("127.0.0.1:1", MODEL, 1.0)):
        assert transports.authorize(transport, "k").metadata == (("authorization", "Bearer k"),)
        transport.channel.close()


