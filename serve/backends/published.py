"""What export published under ``models/NAME/``: the version numbers, and each version's manifest."""

import os

from contract import ASSETS_EXTRA, MANIFEST_FILE
from contract import published as publications

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
        if n.isascii() and n.isdigit()  # int() reads other scripts' digits too; a version is ASCII
        and os.path.isfile(os.path.join(model_dir, n, SAVED_MODEL_FILE))
        and os.path.isfile(os.path.join(model_dir, n, model_file))
    )


def manifest_path(version_dir):
    """Where export puts a version's :class:`contract.published.Published` manifest."""
    return os.path.join(version_dir, ASSETS_EXTRA, MANIFEST_FILE)


def manifest(version_dir):
    """The manifest export copied into ``assets.extra``, as a :class:`contract.published.Published`.

    None when there is none (a SavedModel from elsewhere: the server serves it without the
    manifest's class names and confidence facts). A manifest this version cannot use, an older
    format among them, raises :class:`contract.manifest.ManifestError` naming the file, the
    problem and, for an older format, the commands that rebuild it: the version is refused, not
    served without its facts.
    """
    path = manifest_path(version_dir)
    if not os.path.exists(path):
        return None
    return publications.read_published(path)
