"""From uploaded bytes to labelled predictions: the core that the web form and ``/api/v1/predict`` share.

No Flask here: a :class:`Classifier` is given its backend, the pixel limit and a counter of the
images that reach the model, so it runs (and is tested) without an app. ``create_app`` makes
one per app, in ``app.extensions["serve.classifier"]``.
"""

import dataclasses

import numpy as np

from contract import (OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE,
                      OUTPUT_PROBABILITIES)
from contract.ranking import top_k as rank
from serve import images
from serve.errors import ServeError


@dataclasses.dataclass(frozen=True)
class Upload:
    """One image of a request: its bytes, or ``error``, why the request's encoding of it could not be read."""

    filename: str = None
    data: bytes = b""
    error: str = None  # e.g. "is not valid base64": the image is answered with a 400


def float32_list(array):
    """float32 values as the shortest decimals that round-trip (0.93, not 0.9300000071525879)."""
    return np.asarray(array, np.float32).astype(str).astype(np.float64).tolist()


def model_info(meta):
    return {"name": meta["name"], "version": meta["version"], "architecture": meta["architecture"]}


def parse_top_k(value, default):
    """``top_k`` from a query or form value; raises ``ValueError`` with a readable reason."""
    if value is None or value == "":
        return default
    try:
        top_k = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"top_k must be a whole number, got {value!r}") from None
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    return top_k


class Classifier:
    """Classifies uploads on ``backend``; ``on_images(n)`` is told how many images reached the model, and
    ``on_answers(version, outputs)`` what it answered."""

    def __init__(self, backend, max_pixels=images.DEFAULT_MAX_PIXELS, on_images=None, on_answers=None):
        self.backend = backend
        self.max_pixels = max_pixels
        self._on_images = on_images
        self._on_answers = on_answers

    def classify(self, uploads, top_k):
        """Classify ``uploads``, a list of :class:`Upload`.

        Returns ``(meta, slots)``: the backend's metadata and one dict per upload, either a
        prediction (``filename``, ``label``, ``class_id``, ``probability``, ``top_k``,
        ``ood_score`` and ``in_distribution``; plus ``format`` and ``data`` for the page) or an
        error (``filename``, ``error``, ``status``). ``ood_score`` is None for a model exported
        without one, ``in_distribution`` for a model exported without a threshold
        (:func:`confidence_of`).
        Raises :class:`ServeError` when the backend cannot answer at all.
        """
        meta = self.backend.metadata()
        slots, good, pixels = [], [], []
        decoded = iter(images.decode_many([u.data for u in uploads if u.error is None], self.max_pixels))
        for index, upload in enumerate(uploads):
            who = repr(upload.filename) if upload.filename else f"instance {index}"
            if upload.error is not None:  # the caller already found it unusable (bad base64)
                slots.append({"filename": upload.filename, "error": f"{who}: {upload.error}", "status": 400})
                continue
            result = next(decoded)
            if isinstance(result, ServeError):
                slots.append({"filename": upload.filename, "error": f"{who} {result}", "status": result.status})
                continue
            array, fmt = result
            slots.append({"filename": upload.filename, "format": fmt, "data": upload.data})
            good.append(index)
            pixels.append(array)
        if not good:
            return meta, slots
        outputs = self.backend.predict(np.stack(pixels))
        if self._on_images is not None:
            self._on_images(len(good))
        if self._on_answers is not None:
            self._on_answers(meta["version"], outputs)
        probabilities = np.asarray(outputs[OUTPUT_PROBABILITIES])
        names = label_names(meta, outputs, probabilities.shape[1])
        order, best = rank(probabilities, top_k)
        # One conversion for the whole batch, not one per image: it is most of the per-image cost here.
        top_probabilities = float32_list(best)
        scores, inside = confidence_of(outputs, len(good))
        for row, index in enumerate(good):
            ranked = [
                {"label": names[c], "class_id": c, "probability": p}
                for c, p in zip(order[row].tolist(), top_probabilities[row])
            ]
            slots[index].update(
                label=ranked[0]["label"], class_id=ranked[0]["class_id"], probability=ranked[0]["probability"],
                top_k=ranked, ood_score=scores[row], in_distribution=inside[row],
            )
        return meta, slots


def confidence_of(outputs, rows):
    """Each row's ``ood_score`` (a float) and ``in_distribution`` (a bool), or None where the model has neither.

    The label is answered either way: ``in_distribution: false`` says the image looks like none of
    the classes, and leaves it to the caller what to do with the label.
    """
    scores = float32_list(outputs[OUTPUT_OOD_SCORE]) if OUTPUT_OOD_SCORE in outputs else [None] * rows
    inside = (np.asarray(outputs[OUTPUT_IN_DISTRIBUTION], bool).tolist() if OUTPUT_IN_DISTRIBUTION in outputs
              else [None] * rows)
    return scores, inside


def label_names(meta, outputs, num_classes):
    """The name of each class id: the manifest's, else what the model answered, else ``class_N``."""
    names = meta.get("class_names")
    if names and len(names) == num_classes:
        return list(names)
    # No manifest at hand (a bare TF Serving): name what the model named, number the rest.
    names = [f"class_{c}" for c in range(num_classes)]
    for c, name in zip(np.asarray(outputs[OUTPUT_CLASS_IDS]).tolist(), np.asarray(outputs[OUTPUT_CLASS_NAMES]).tolist()):
        names[c] = name.decode() if isinstance(name, bytes) else str(name)
    return names


def public(slot):
    """A slot as the JSON API shows it (without the page's ``format`` and ``data``)."""
    return {key: value for key, value in slot.items() if key not in ("format", "data")}
