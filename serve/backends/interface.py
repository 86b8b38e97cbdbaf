"""What every prediction backend shares: the probe batch and the manifest's facts."""

import numpy as np

from contract import CHANNELS, IMAGE_SIZE


def probe_batch():
    """One black image: what ``ready()`` predicts to prove the model answers."""
    return np.zeros((1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS), np.uint8)


def model_facts(manifest):
    """``(architecture, class_names, confidence)`` from a published :class:`contract.manifest.Manifest`.

    ``confidence``: how the served probabilities and verdicts were made (export/calibration.py), for
    ``/api/v1/model``: ``calibrated``, ``temperature``, ``method`` and ``threshold``; None for a
    model exported before export wrote it. All three are None without a manifest.
    """
    if manifest is None:
        return None, None, None
    section = manifest.extra.get("confidence")
    confidence = None
    if isinstance(section, dict):
        ood = section.get("ood") or {}
        confidence = {"calibrated": section.get("calibrated"), "temperature": section.get("temperature"),
                      "method": ood.get("method"), "threshold": ood.get("threshold")}
    return manifest.model.name, list(manifest.class_names), confidence
