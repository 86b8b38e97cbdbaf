"""A TF Serving backend over a published manifest it cannot read is refused at start, in one line with the fix."""

import json
import os
import subprocess
import sys

import pytest

from contract import ASSETS_EXTRA, MANIFEST_FILE
from contract import manifest as manifests
from serve import create_app
from serve.settings import SettingsError

TFSERVING = {"SERVE_BACKEND": "tfserving-rest", "TFSERVING_REST_URL": "http://127.0.0.1:9"}


@pytest.fixture(params=[2, manifests.FORMAT + 1], ids=["older", "newer"])
def refused_dir(request, tmp_path):
    """``models/cifar10`` whose one version's manifest is in another format than this pipeline reads."""
    version = tmp_path / "cifar10" / "1"
    (version / ASSETS_EXTRA).mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    (version / ASSETS_EXTRA / MANIFEST_FILE).write_text(json.dumps({"format": request.param}))
    return version.parent


def _serve(args, model_dir):
    return subprocess.run([sys.executable, "-m", "serve", "--model-dir", str(model_dir), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **TFSERVING, "GRPC_PORT": "0"})


def test_check_refuses_the_manifest_in_one_line_naming_the_variable_and_the_fix(refused_dir):
    result = _serve(["--check"], refused_dir)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"serve: MODEL_DIR='{refused_dir}': ") and "format" in line
    assert manifests.REBUILD in line or "upgrade the pipeline" in line


def test_gunicorn_stops_before_a_worker_starts(refused_dir):
    """``python -m serve`` as the image runs it: gunicorn's config refuses the start (exit 2), no worker's traceback."""
    result = _serve([], refused_dir)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "Booting worker" not in result.stderr
    assert "MODEL_DIR=" in result.stderr and "manifest format" in result.stderr


def test_the_app_factory_raises_the_same_line(refused_dir):
    with pytest.raises(SettingsError, match=r"^MODEL_DIR=.*manifest format"):
        create_app({"TESTING": True, "MODEL_DIR": str(refused_dir), "BACKEND": "tfserving-rest",
                    "TFSERVING_REST_URL": "http://127.0.0.1:9"})
