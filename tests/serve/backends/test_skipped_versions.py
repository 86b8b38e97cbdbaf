"""A newer version is never passed over in silence: export fails when the default runtime's model is
refused, and the server logs, shows and counts every version it skips."""

import dataclasses
import json
import logging
import os
import shutil

import pytest

import contract
from contract import manifest as manifests
from contract import published as publications
from runs import copy_run

#: Every test here needs the model trained and exported in the session (tests/serve/conftest.py).
pytestmark = pytest.mark.end_to_end


def test_export_fails_when_the_default_runtimes_model_is_refused(trained_run, tmp_path, monkeypatch, capsys):
    from export import exporter, litert

    def broken(saved_model_dir):
        raise RuntimeError("the converter broke")

    monkeypatch.setattr(litert, "convert_float", broken)
    run = copy_run(trained_run, tmp_path / "run")
    code = exporter.main(["--run", str(run), "--model-dir", str(tmp_path / "models"), "--model-name", "cifar10", "--quiet"])
    assert code == exporter.EXIT_DEFAULT_RUNTIME_REFUSED
    err = capsys.readouterr().err
    assert "error:" in err and "litert" in err and "the converter broke" in err and "SERVE_RUNTIME=savedmodel" in err
    # Nothing already made is lost: the version is published for the runtimes that can serve it.
    version = tmp_path / "models" / "cifar10" / "1"
    assert (version / "saved_model.pb").is_file() and not (version / contract.LITERT_FILE).exists()


def test_export_succeeds_when_only_the_int8_model_is_refused(trained_run, tmp_path, monkeypatch, capsys):
    from export import exporter, litert

    def broken(saved_model_dir):
        raise RuntimeError("the quantizer broke")

    monkeypatch.setattr(litert, "convert_int8", broken)  # int8 is not made: a warning, not a failure
    assert exporter.main(["--run", str(trained_run), "--model-dir", str(tmp_path / "models"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "(litert-int8) not published: conversion failed: the quantizer broke" in err and "error:" not in err


def _second_version_without_litert(model_base, tmp_path):
    """``models/cifar10`` with version 1 as exported and version 2 whose float LiteRT model export refused."""
    models = tmp_path / "cifar10"
    shutil.copytree(model_base, models)
    shutil.copytree(models / "1", models / "2")
    os.remove(models / "2" / contract.LITERT_FILE)
    manifest_path = str(models / "2" / contract.ASSETS_EXTRA / contract.MANIFEST_FILE)
    manifest = publications.read_published(manifest_path)
    refused = publications.RuntimeCheck(file=contract.LITERT_FILE, published=False, reason="the gate said no")
    litert = dataclasses.replace(manifest.export.litert, runtimes={**manifest.export.litert.runtimes, "litert": refused})
    manifests.write(manifest_path, dataclasses.replace(manifest, export=dataclasses.replace(manifest.export, litert=litert)))
    return models


def test_the_server_logs_shows_and_counts_a_skipped_version(model_base, tmp_path, caplog):
    from serve import create_app

    models = _second_version_without_litert(model_base, tmp_path)
    with caplog.at_level(logging.WARNING, logger="serve.backends.local"):
        app = create_app({"TESTING": True, "MODEL_DIR": str(models), "MODEL_NAME": "cifar10"})
        app.extensions["serve.backend"].wait_loaded()
    try:
        client = app.test_client()
        assert any("skipping version 2" in r.getMessage() and "the gate said no" in r.getMessage() for r in caplog.records)
        ready = client.get("/readyz").get_json()
        assert ready["version"] == 1
        assert ready["skipped_versions"] == [{"version": 2, "reason": ready["skipped_versions"][0]["reason"]}]
        assert "the gate said no" in ready["skipped_versions"][0]["reason"]
        info = client.get("/api/v1/model").get_json()
        assert info["version"] == 1 and [s["version"] for s in info["skipped_versions"]] == [2]
        metrics = client.get("/metrics").get_data(as_text=True)
        assert 'serve_model_version_skipped{runtime="litert",version="2"} 1.0' in metrics
    finally:
        app.extensions["serve.backend"].close()


def test_a_version_that_appears_later_without_the_runtimes_file_is_skipped_too(model_base, tmp_path):
    from serve import create_app

    models = tmp_path / "cifar10"
    shutil.copytree(model_base, models)
    app = create_app({"TESTING": True, "MODEL_DIR": str(models), "MODEL_NAME": "cifar10", "MODEL_POLL_S": 0.001})
    backend = app.extensions["serve.backend"]
    backend.wait_loaded()
    try:
        assert app.test_client().get("/readyz").get_json().get("skipped_versions") is None
        shutil.copytree(models / "1", models / "2")
        os.remove(models / "2" / contract.LITERT_FILE)
        backend.info()  # a request polls for new versions
        info = app.test_client().get("/api/v1/model").get_json()
        assert info["version"] == 1 and [s["version"] for s in info["skipped_versions"]] == [2]
    finally:
        backend.close()


def test_a_version_in_an_older_manifest_format_is_refused_with_the_commands_that_rebuild_it(model_base, tmp_path):
    from serve import create_app

    models = tmp_path / "cifar10"
    shutil.copytree(model_base, models)
    shutil.copytree(models / "1", models / "2")
    path = models / "2" / contract.ASSETS_EXTRA / contract.MANIFEST_FILE
    raw = json.loads(path.read_text())
    raw["format"] = 2  # what an older pipeline wrote
    path.write_text(json.dumps(raw))
    app = create_app({"TESTING": True, "MODEL_DIR": str(models), "MODEL_NAME": "cifar10"})
    backend = app.extensions["serve.backend"]
    backend.wait_loaded()
    try:
        client = app.test_client()
        ready = client.get("/readyz")
        assert ready.status_code == 503
        error = ready.get_json()["error"]
        assert "version 2 is refused" in error and "manifest format 2, not 4" in error
        assert manifests.REBUILD in error and "\n" not in error
        assert client.get("/api/v1/model").status_code == 503  # never served without its manifest's facts
    finally:
        backend.close()
