"""The command-line client against a live server and the TF Serving stand-in, in-process and as `python -m client`."""

import json
import os
import subprocess
import sys

import pytest

import contract
import synthetic
from client import cli, transports
from live_server import free_port, live_server  # noqa: F401  (imported for its fixture)
from tfserving_standin import tfserving  # noqa: F401  (imported for its fixture)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VIAS = ("api", "tfserving-rest", "tfserving-grpc", "v2")


def write_images(folder, per_class=2, seed=3):
    """PNG files named after their class; returns {path: true label}."""
    os.makedirs(folder, exist_ok=True)
    images, labels = synthetic.make_images(per_class, seed=seed)
    truth = {}
    for i, (image, label) in enumerate(zip(images, labels)):
        path = os.path.join(folder, f"{i:03d}_{synthetic.CLASS_NAMES[label]}.png")
        with open(path, "wb") as f:
            f.write(synthetic.encode(image))
        truth[str(path)] = synthetic.CLASS_NAMES[label]
    return truth


class _Urls:
    """Server addresses by --via; each server starts only when a test first asks for it."""

    def __init__(self, request):
        self.request = request

    def __getitem__(self, via):
        if via in ("api", "v2"):  # this project's server speaks both
            return self.request.getfixturevalue("live_server")
        standin = self.request.getfixturevalue("tfserving")
        return standin.rest_url if via == "tfserving-rest" else standin.grpc_target


@pytest.fixture
def urls(request):
    return _Urls(request)


def run_json(capsys, args):
    code = cli.main(["predict", *args, "--json"])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


@pytest.fixture(scope="module")
def model_says(model_base):
    """{path: (label, probability)} from the SavedModel itself: what the client must report.

    The tiny test model is not always right, so the reference is the model, not the file name.
    """
    import tensorflow as tf

    signature = tf.saved_model.load(str(model_base / "1")).signatures[contract.SIGNATURE_BYTES]

    def says(paths):
        data = [open(p, "rb").read() for p in paths]
        out = signature(**{contract.INPUT_BYTES: tf.constant(data)})
        names = [n.decode() for n in out[contract.OUTPUT_CLASS_NAMES].numpy()]
        best = out[contract.OUTPUT_PROBABILITIES].numpy().max(axis=1)
        return dict(zip(paths, zip(names, best.tolist())))

    return says


def assert_right(results, expected):
    assert {r["file"]: r["label"] for r in results} == {p: label for p, (label, _) in expected.items()}
    for r in results:
        assert r["probability"] == pytest.approx(expected[r["file"]][1], abs=1e-4)


def test_table_shows_file_label_probability_and_top_k(live_server, model_says, tmp_path, capsys):  # noqa: F811
    truth = write_images(tmp_path)
    code = cli.main(["predict", *truth, "--url", live_server])
    out, err = capsys.readouterr()
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["FILE", "LABEL", "PROBABILITY", "IN-DISTRIBUTION"] and "TOP-3" in header
    assert len(rows) == len(truth)
    expected = model_says(list(truth))
    for row in rows:
        path, label, probability, verdict, *top = row.split()
        assert verdict in ("yes", "NO")
        if verdict == "NO":
            assert top[0] == "(score" and top[1].endswith(")")
            top = top[2:]
        assert path in truth and label in synthetic.CLASS_NAMES
        assert 0.0 < float(probability) <= 1.0
        assert top[0] == label  # the best of the top-k is the label itself
        assert len(top) == 2 * 3  # three "label probability," pairs
        assert label == expected[path][0]


@pytest.mark.parametrize("via", VIAS)
def test_json_gives_one_object_per_image_with_the_right_labels(via, urls, model_says, tmp_path, capsys):
    truth = write_images(tmp_path)
    code, results, err = run_json(capsys, [*truth, "--via", via, "--url", urls[via], "--top-k", "2"])
    assert code == 0, err
    assert [r["file"] for r in results] == list(truth)
    assert_right(results, model_says(list(truth)))
    for r in results:
        assert [t["probability"] for t in r["top_k"]] == sorted((t["probability"] for t in r["top_k"]), reverse=True)
        assert len(r["top_k"]) == 2
        assert r["top_k"][0]["label"] == r["label"] and r["top_k"][0]["class_id"] == r["class_id"]
        assert r["top_k"][0]["probability"] == pytest.approx(r["probability"], abs=1e-6)


def test_all_transports_agree(urls, tmp_path, capsys):
    truth = write_images(tmp_path, per_class=1, seed=5)
    answers = {}
    for via in VIAS:
        code, results, err = run_json(capsys, [str(tmp_path), "--via", via, "--url", urls[via]])
        assert code == 0, err
        answers[via] = [(r["file"], r["label"], round(r["probability"], 4)) for r in results]
    assert answers["api"] == answers["tfserving-rest"] == answers["tfserving-grpc"] == answers["v2"]
    assert len(answers["api"]) == len(truth)


def test_directories_are_walked_and_globs_expanded(live_server, tmp_path, capsys):  # noqa: F811
    nested = write_images(tmp_path / "photos" / "nested", per_class=1, seed=1)
    flat = write_images(tmp_path / "photos", per_class=1, seed=2)
    (tmp_path / "photos" / "README.txt").write_text("not an image, and not picked up from a directory")
    code, results, err = run_json(capsys, [str(tmp_path / "photos"), "--url", live_server])
    assert code == 0, err
    assert sorted(r["file"] for r in results) == sorted([*nested, *flat])

    code, results, err = run_json(capsys, [str(tmp_path / "photos" / "*.png"), "--url", live_server])
    assert code == 0, err
    assert sorted(r["file"] for r in results) == sorted(flat)

    code, results, err = run_json(capsys, [str(tmp_path / "**" / "0*.png"), "--url", live_server])
    assert code == 0, err
    assert sorted(r["file"] for r in results) == sorted([*nested, *flat])


@pytest.mark.parametrize("via", ("api", "tfserving-grpc"))
def test_many_files_are_sent_in_batches(via, urls, model_says, tmp_path, capsys, monkeypatch):
    truth = write_images(tmp_path, per_class=3)  # 9 images
    transport = {"api": transports.ApiTransport, "tfserving-grpc": transports.TFServingGrpcTransport}[via]
    sizes = []
    real_predict = transport.predict

    def counting_predict(self, batch, top_k):
        sizes.append(len(batch))
        return real_predict(self, batch, top_k)

    monkeypatch.setattr(transport, "predict", counting_predict)
    code, results, err = run_json(capsys, [str(tmp_path), "--via", via, "--url", urls[via], "--batch-size", "4"])
    assert code == 0, err
    assert sizes == [4, 4, 1]
    assert_right(results, model_says(sorted(truth)))


def test_progress_bar_when_forced(live_server, tmp_path, capsys):  # noqa: F811
    write_images(tmp_path, per_class=1)
    code = cli.main(["predict", str(tmp_path), "--url", live_server, "--progress", "--batch-size", "2"])
    err = capsys.readouterr().err
    assert code == 0
    assert "3/3" in err and "1/3" not in err and "2/3" in err


def test_no_progress_bar_when_not_a_terminal(live_server, tmp_path, capsys):  # noqa: F811
    write_images(tmp_path, per_class=1)
    assert cli.main(["predict", str(tmp_path), "--url", live_server]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("via", VIAS)
def test_a_file_that_is_not_an_image_fails_alone_with_exit_1(via, urls, tmp_path, capsys):
    truth = write_images(tmp_path, per_class=1)
    bad = tmp_path / "notes.txt"
    bad.write_text("these are not pixels")
    paths = [*truth, str(bad)]
    code, results, err = run_json(capsys, [*paths, "--via", via, "--url", urls[via]])
    assert code == 1
    failed = [r for r in results if "error" in r]
    assert [r["file"] for r in failed] == [str(bad)]
    assert sorted(r["file"] for r in results if "label" in r) == sorted(truth)
    lines = err.splitlines()
    assert lines[0].startswith(f"client: {bad}: ") and len(lines[0]) > len(f"client: {bad}: ")
    assert "1 of 4 files failed" in lines[-1]
    assert "Traceback" not in err


def test_all_files_bad_is_exit_1_with_each_named(live_server, tmp_path, capsys):  # noqa: F811
    bad = [tmp_path / "a.png", tmp_path / "b.png"]
    for path in bad:
        path.write_bytes(b"\x89PNG but truncated")
    code = cli.main(["predict", *map(str, bad), "--url", live_server])
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    assert err[0].startswith(f"client: {bad[0]}: ") and err[1].startswith(f"client: {bad[1]}: ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["predict", "missing.png"], "missing.png: no such file or directory"),
        (["predict", "EMPTY"], "no image files found"),
        (["predict", "EMPTY/*.png"], "no files match"),
        (["predict", "IMAGE", "--top-k", "0"], "--top-k"),
        (["predict", "IMAGE", "--via", "carrier-pigeon"], "--via"),
        (["predict"], "required"),
        (["teleport"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, message, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    image = tmp_path / "x.png"
    image.write_bytes(synthetic.encode(synthetic.make_images(1)[0][0]))
    args = [str(tmp_path / "empty") + a[5:] if a.startswith("EMPTY") else str(image) if a == "IMAGE" else a for a in args]
    # A closed port: a usage error must be reported before anything is sent.
    code = cli.main([*args, "--url", f"http://127.0.0.1:{free_port()}"] if len(args) > 1 and args[0] == "predict" else args)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize("command", ("predict", "health", "info"))
def test_closed_port_is_exit_3(via, command, tmp_path, capsys):
    image = tmp_path / "x.png"
    image.write_bytes(synthetic.encode(synthetic.make_images(1)[0][0]))
    url = f"127.0.0.1:{free_port()}" if via == "tfserving-grpc" else f"http://127.0.0.1:{free_port()}"
    args = [command, *([str(image)] if command == "predict" else []), "--via", via, "--url", url, "--timeout", "5"]
    code = cli.main(args)
    err = capsys.readouterr().err
    assert code == 3
    assert len(err.strip().splitlines()) == 1 and "cannot reach" in err


def test_unknown_model_on_tfserving_is_reported(tfserving, capsys):  # noqa: F811
    assert cli.main(["health", "--via", "tfserving-rest", "--url", tfserving.rest_url, "--model", "nosuch"]) == 1
    assert "nosuch" in capsys.readouterr().err


def test_health_and_info_from_the_api(live_server, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv(cli.URL_ENV, live_server)  # no --url: the environment names the server
    assert cli.main(["health"]) == 0
    assert capsys.readouterr().out.startswith("ready")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cifar10" in out and ", ".join(synthetic.CLASS_NAMES) in out
    assert "version:      1" in out
    assert "serving_default" in out and "predict_images" in out
    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["name"] == "cifar10" and info["version"] == 1 and info["class_names"] == list(synthetic.CLASS_NAMES)


@pytest.mark.parametrize("via", ("tfserving-rest", "tfserving-grpc"))
def test_health_and_info_from_tfserving(via, urls, capsys):
    assert cli.main(["health", "--via", via, "--url", urls[via]]) == 0
    assert '"versions": [1]' in capsys.readouterr().out
    assert cli.main(["info", "--json", "--via", via, "--url", urls[via]]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["name"] == "cifar10" and info["version"] == 1
    assert info["signatures"]["predict_images"] == {
        "inputs": ["image_bytes"], "outputs": ["class_ids", "class_names", "in_distribution", "ood_score", "probabilities"]}
    assert info["signatures"]["serving_default"]["inputs"] == ["images"]




def run_client(args, env=None, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "client", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_python_m_client_predicts_without_tensorflow_on_every_transport(urls, model_says, tmp_path):
    truth = write_images(tmp_path / "images", per_class=1)
    blocker = tmp_path / "blocker" / "tensorflow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('the client must not import tensorflow')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "blocker")}
    proof = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, cwd=REPO, capture_output=True, text=True)
    assert proof.returncode != 0 and "the client must not import tensorflow" in proof.stderr
    for via in VIAS:
        done = run_client(["predict", str(tmp_path / "images"), "--json", "--via", via, "--url", urls[via]], env=env)
        assert done.returncode == 0, (via, done.stderr)
        results = [json.loads(line) for line in done.stdout.splitlines()]
        assert_right(results, model_says(sorted(truth)))


def test_python_m_client_exit_codes_and_one_line_errors(live_server, tmp_path):  # noqa: F811
    done = run_client(["predict", str(tmp_path / "missing.png"), "--url", live_server])
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    done = run_client(["health", "--url", f"http://127.0.0.1:{free_port()}"])
    assert done.returncode == 3 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    done = run_client(["health", "--url", live_server])
    assert done.returncode == 0 and done.stdout.startswith("ready")
