"""Export stage: a training run's weights to a versioned SavedModel for TF Serving.

* :mod:`export.exporter` - the CLI and the order of the steps (read the run, check, write, publish);
* :mod:`export.verify` - the rebuilt model against the manifest's fingerprint, the SavedModel against it;
* :mod:`export.calibration` - the temperature and out-of-distribution threshold, from held-out images;
* :mod:`export.savedmodel` - the two serving signatures, TF Serving's warmup records;
* :mod:`export.litert` - the float32 and int8 LiteRT models beside the SavedModel.
"""


class ExportError(Exception):
    """A problem the user can fix; reported as one line with exit code 2."""
