"""Training runs as the tests use them."""

import shutil

import contract


def copy_run(trained_run, to):
    """The files export reads from a run, copied so a test can change them."""
    to.mkdir()
    for name in (contract.MANIFEST_FILE, contract.WEIGHTS_FILE, contract.SAMPLES_FILE, contract.HOLDOUT_FILE):
        shutil.copy(trained_run / name, to / name)
    return to
