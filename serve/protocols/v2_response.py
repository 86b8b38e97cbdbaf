"""The Open Inference Protocol's inference response: output tensors as JSON or binary tensor data,
and the classification extension's top-k strings."""

import struct

import numpy as np

from contract import OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES
from serve.core import float32_list

_LITTLE_ENDIAN = {"FP32": "<f4", "INT64": "<i8", "BOOL": "|b1"}
#: The protocol's datatype of each output.
DATATYPES = {OUTPUT_PROBABILITIES: "FP32", OUTPUT_CLASS_IDS: "INT64", OUTPUT_CLASS_NAMES: "BYTES",
             OUTPUT_OOD_SCORE: "FP32", OUTPUT_IN_DISTRIBUTION: "BOOL"}


def output_tensors(info, outputs):
    """``{output name: (datatype, array)}`` from the core's answer (``info``: the model's :class:`ModelInfo`)."""
    probabilities = np.asarray(outputs[OUTPUT_PROBABILITIES], np.float32)
    if OUTPUT_CLASS_IDS in outputs:
        class_ids = np.asarray(outputs[OUTPUT_CLASS_IDS], np.int64)
    else:
        class_ids = np.argmax(probabilities, axis=1).astype(np.int64)
    if OUTPUT_CLASS_NAMES in outputs:
        class_names = np.asarray(outputs[OUTPUT_CLASS_NAMES], dtype=object)
    else:
        names = info.label_names(outputs, probabilities.shape[1])
        class_names = np.array([names[c].encode() for c in class_ids.tolist()], dtype=object)
    tensors = {
        OUTPUT_PROBABILITIES: ("FP32", probabilities),
        OUTPUT_CLASS_IDS: ("INT64", class_ids),
        OUTPUT_CLASS_NAMES: ("BYTES", class_names),
    }
    for key in (OUTPUT_OOD_SCORE, OUTPUT_IN_DISTRIBUTION):
        if key in outputs:
            tensors[key] = (DATATYPES[key], np.asarray(outputs[key], _LITTLE_ENDIAN[DATATYPES[key]]))
    return tensors


def classification(ranked):
    """The classification extension: BYTES ``[N, k]`` of ``"<probability>:<class id>:<label>"``, best first.

    ``ranked``: each image's top k from :meth:`serve.core.service.InferenceService.top_k`.
    """
    rows = [[f"{r.probability}:{r.class_id}:{r.label}".encode() for r in row] for row in ranked]
    return np.array(rows, dtype=object).reshape(len(rows), len(rows[0]) if rows else 0)


def to_json(datatype, array):
    if datatype == "FP32":
        return float32_list(array.ravel())
    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.ravel().tolist()]
    return array.ravel().tolist()


def to_binary(datatype, array):
    if datatype == "BYTES":
        parts = []
        for value in array.ravel().tolist():
            value = value if isinstance(value, bytes) else str(value).encode()
            parts += [struct.pack("<I", len(value)), value]
        return b"".join(parts)
    return np.ascontiguousarray(array, _LITTLE_ENDIAN[datatype]).tobytes()
