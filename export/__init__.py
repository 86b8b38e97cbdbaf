"""Export stage: a training run's weights to a versioned SavedModel for TF Serving.

* :mod:`export.exporter` - the CLI and the order of the steps (read the run, check, write, publish);
* :mod:`export.verify` - the rebuilt model against the manifest's fingerprint, the SavedModel against it;
* :mod:`export.calibration` - the temperature and out-of-distribution threshold, from held-out images;
* :mod:`export.savedmodel` - the two serving signatures, TF Serving's warmup records;
* :mod:`export.litert` - the float32 and int8 LiteRT models beside the SavedModel.
"""

import os

from contract import CHANNELS, IMAGE_SIZE, sha256_file


class ExportError(Exception):
    """A problem the user can fix; reported as one line with exit code 2."""


def read_images(run_dir, entry, prefix=""):
    """uint8 images and int64 labels (arrays ``{prefix}images`` and ``{prefix}labels``) from the ``.npz``
    file of ``run_dir`` that the manifest's ``entry`` describes by its ``file`` and ``sha256``: the held-out
    slice, or the training and test samples; :class:`ExportError` saying what is wrong."""
    import numpy as np

    path = os.path.join(run_dir, entry.file)
    if not os.path.isfile(path):
        raise ExportError(f"the run's manifest names {entry.file}, but {path} is missing")
    if sha256_file(path) != entry.sha256:
        raise ExportError(f"{path} is not the file the run's manifest describes (sha256 differs)")
    try:
        with np.load(path, allow_pickle=False) as data:
            images, labels = data[f"{prefix}images"], data[f"{prefix}labels"]
    except (OSError, ValueError, KeyError) as exc:
        raise ExportError(f"cannot read {path}: {one_line(exc)}") from None
    if (images.dtype != np.uint8 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE, CHANNELS) or not len(images)
            or labels.shape != (len(images),)):
        raise ExportError(f"{path} holds {images.dtype} {prefix}images {list(images.shape)} and {prefix}labels "
                          f"{list(labels.shape)}, not uint8 [N, {IMAGE_SIZE}, {IMAGE_SIZE}, {CHANNELS}] and [N], N > 0")
    return images, labels.astype(np.int64)


def one_line(exc):
    """``exc`` as one line of at most 300 characters, for an error message."""
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__
