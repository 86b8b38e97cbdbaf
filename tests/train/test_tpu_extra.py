"""The `tpu` extra, installed from its lock into a fresh virtual environment as a TPU VM user would, on this CPU machine.

tensorflow-tpu 2.20 with the libtpu pip resolves made `import tensorflow` abort, and with an
older libtpu hang; the extra now brings JAX with the libtpu JAX pins, beside the CPU TensorFlow
that feeds tf.data. Without a TPU, training under JAX must run on the CPU with one line saying so.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import synthetic

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_tpu_extra_installs_imports_and_trains_on_a_machine_without_a_tpu(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # The extra's lock, as every install here (docs/training.md: "Installs and the lock"), then the project alone.
    # uv, which scripts/test.sh installs beside the tests, takes the wheels the tests' own install
    # left in its cache (libtpu is the one it downloads): seconds where pip resolving and
    # downloading the extra took over 3 minutes.
    if importlib.util.find_spec("uv"):
        installer = [sys.executable, "-m", "uv", "pip", "install", "-q", "--python", python, "--system-certs"]
    else:
        installer = [python, "-m", "pip", "install", "-q", "--no-input"]
    for args in (["--require-hashes", "-r", os.path.join(REPO, "requirements", "tpu.txt")],
                 ["--no-deps", "--no-build-isolation", "-e", REPO]):
        install = subprocess.run([*installer, *args], capture_output=True, text=True, timeout=1200)
        assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "JAX_PLATFORMS", "XLA_FLAGS")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"

    imports = subprocess.run(
        [python, "-c", "import tensorflow, jax, libtpu; print(tensorflow.__version__, jax.__version__)"],
        capture_output=True, text=True, timeout=300, env=env)
    assert imports.returncode == 0, imports.stderr[-3000:]

    data = synthetic.write_zip(tmp_path / "data.zip", synthetic.make_splits(train_per_class=32, test_per_class=8))
    output = tmp_path / "run"
    train = subprocess.run(
        [python, "-m", "train", "--keras-backend", "jax", "--data", str(data), "--output", str(output), "--epochs", "1",
         "--batch-size", "16"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert train.returncode == 0, train.stderr[-3000:]
    assert train.stdout.splitlines()[0] == "no TPU found; training on 1 CPU device(s)"
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["training"]["keras_backend"] == "jax" and manifest["training"]["hardware"] == "cpu"
