"""What every prediction backend shares: the probe batch and the manifest's facts."""

import numpy as np

from contract import CHANNELS, IMAGE_SIZE


def probe_batch():
    """One black image: what ``ready()`` predicts to prove the model answers."""
    return np.zeros((1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS), np.uint8)


def model_facts(manifest):
    """``(architecture, class_names)`` from a published :class:`contract.manifest.Manifest`; ``(None, None)`` without one."""
    if manifest is None:
        return None, None
    return manifest.model.name, list(manifest.class_names)
