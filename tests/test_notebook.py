import os
import shlex

import nbformat

from train import trainer

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks", "train_on_tpu.ipynb")


def _shell_commands(nb):
    for cell in nb.cells:
        if cell.cell_type == "code":
            for line in cell.source.splitlines():
                if line.startswith("!"):
                    yield shlex.split(line[1:])


def test_notebook_is_valid_and_asks_for_a_tpu():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["accelerator"] == "TPU"


def test_notebook_installs_the_tpu_extra_and_trains_with_the_same_cli():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    commands = list(_shell_commands(nb))
    assert any(c[:3] == ["pip", "install", "-q"] and ".[tpu]" in c for c in commands)
    train = [c for c in commands if c[:3] == ["python", "-m", "train"]]
    assert len(train) == 1
    args = trainer.build_parser().parse_args(train[0][3:])  # the CLI accepts exactly these flags
    assert args.tpu == "local"
    downloads = "".join(cell.source for cell in nb.cells)
    assert f"{args.output}/model.weights.h5" in downloads and f"{args.output}/manifest.json" in downloads
