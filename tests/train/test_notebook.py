"""The Colab TPU notebook: valid, keeps the runtime's JAX, and its cells run unchanged on this CPU."""

import json
import os
import shlex

import nbformat
import pytest

import synthetic
from train import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(REPO, "notebooks", "train_on_tpu.ipynb")


def _code(nb):
    return "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")


def test_notebook_is_valid_and_asks_for_a_tpu():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["accelerator"] == "TPU"


def test_notebook_keeps_the_runtimes_jax_and_trains_with_the_same_cli():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = _code(nb)
    assert '".[train-base]"' in code, "installs what training needs beside the runtime's JAX, no TensorFlow"
    for forbidden in (".[tpu]", ".[train]", "tensorflow", "pip uninstall", "jax[", "libtpu-releases"):
        assert forbidden not in code, forbidden
    train = [line for line in code.splitlines() if line.startswith("!") and " -m train " in line]
    assert len(train) == 1
    values = {"{DATA}": "cifar10", "{EPOCHS}": "50", "{PER_CHIP_BATCH}": "128", "{OUTPUT}": "runs/x"}
    command = train[0].split(" -m train ", 1)[1]
    for name, value in values.items():
        command = command.replace(name, value)
    args = cli.build_parser().parse_args(shlex.split(command))  # the CLI accepts exactly these flags
    assert args.keras_backend == "jax" and args.batch_size == 128 and args.output == "runs/x"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Every cell run in a real IPython kernel, as Colab would, on small data."""
    import nbclient

    tmp = tmp_path_factory.mktemp("notebook")
    data = synthetic.write_zip(tmp / "data.zip", synthetic.make_splits(train_per_class=48, test_per_class=8))
    run_dir = tmp / "run"
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {"CIFAR_DATA": str(data), "EPOCHS": "1", "RUN_DIR": str(run_dir), "PROJECT_DIR": REPO,
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp)}}).execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return nb, run_dir


def test_every_cell_runs_on_the_cpu_and_trains_with_jax(executed):
    nb, run_dir = executed
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["training"]["keras_backend"] == "jax"
    assert manifest["training"]["recipe"]["batch_size"] == 128
    assert manifest["training"]["global_batch"] == 128 * manifest["training"]["replicas"]
    assert (run_dir / "model.weights.h5").exists()
    assert os.path.exists(f"{run_dir}-files.zip")
    printed = "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    assert "no TPU on this machine" in printed
    assert "jax on " in printed and '"test_accuracy"' in printed
