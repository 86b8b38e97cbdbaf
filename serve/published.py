"""What export published under ``models/NAME/``: the version numbers, and each version's manifest."""

import logging
import os

from contract import ASSETS_EXTRA, MANIFEST_FILE
from contract import manifest as manifests

SAVED_MODEL_FILE = "saved_model.pb"


def versions(model_dir, model_file=SAVED_MODEL_FILE):
    """Version numbers under ``model_dir`` that hold a SavedModel (and ``model_file``), ascending."""
    try:
        names = os.listdir(model_dir)
    except OSError:
        return []
    return sorted(
        int(n)
        for n in names
        if n.isdigit()
        and os.path.isfile(os.path.join(model_dir, n, SAVED_MODEL_FILE))
        and os.path.isfile(os.path.join(model_dir, n, model_file))
    )


def manifest(version_dir):
    """The manifest export copied into ``assets.extra``, as a :class:`contract.manifest.Manifest`.

    None when there is none (a SavedModel from elsewhere) or it cannot be read; the server
    then serves without class names from it, and logs why.
    """
    path = os.path.join(version_dir, ASSETS_EXTRA, MANIFEST_FILE)
    if not os.path.exists(path):
        return None
    try:
        return manifests.read(path)
    except manifests.ManifestError as e:
        logging.getLogger(__name__).warning("ignoring the published manifest: %s", e)
        return None
