"""From uploaded bytes to labelled predictions: what the web form and /api/v1/predict share."""

import numpy as np
from flask import current_app

from contract import OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, OUTPUT_PROBABILITIES
from serve import images as imaging

def backend():
    return current_app.extensions["serve.backend"]


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


def classify(uploads, top_k):
    """Classify ``uploads``, a list of ``(filename or None, bytes or an error message)``.

    Returns ``(meta, slots)``: the backend's metadata and one dict per upload, either a
    prediction (``filename``, ``label``, ``class_id``, ``probability``, ``top_k``; plus
    ``format`` and ``data`` for the page) or an error (``filename``, ``error``, ``status``).
    Raises ``BackendError`` when the backend cannot answer at all.
    """
    meta = backend().metadata()
    slots, good, pixels = [], [], []
    datas = [data for _, data in uploads if not isinstance(data, str)]
    decoded = iter(imaging.decode_many(datas, current_app.config["MAX_PIXELS"]))
    for index, (filename, data) in enumerate(uploads):
        who = repr(filename) if filename else f"instance {index}"
        if isinstance(data, str):  # the caller already found it unusable (bad base64)
            slots.append({"filename": filename, "error": f"{who}: {data}", "status": 400})
            continue
        result = next(decoded)
        if isinstance(result, imaging.ImageError):
            slots.append({"filename": filename, "error": f"{who} {result}", "status": result.status})
            continue
        array, fmt = result
        slots.append({"filename": filename, "format": fmt, "data": data})
        good.append(index)
        pixels.append(array)
    if not good:
        return meta, slots
    outputs = backend().predict(np.stack(pixels))
    current_app.extensions["serve.metrics"].images.inc(len(good))
    probabilities = np.asarray(outputs[OUTPUT_PROBABILITIES])
    names = _class_names(meta, outputs, probabilities.shape[1])
    k = min(top_k, probabilities.shape[1])
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    # One conversion for the whole batch, not one per image: it is most of the per-image cost here.
    top_probabilities = float32_list(np.take_along_axis(probabilities, order, axis=1))
    for row, index in enumerate(good):
        ranked = [
            {"label": names[c], "class_id": c, "probability": p}
            for c, p in zip(order[row].tolist(), top_probabilities[row])
        ]
        slots[index].update(
            label=ranked[0]["label"], class_id=ranked[0]["class_id"], probability=ranked[0]["probability"], top_k=ranked
        )
    return meta, slots


def _class_names(meta, outputs, num_classes):
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
