"""The Open Inference Protocol's inference response: output tensors as JSON or binary tensor data,
and the classification extension's top-k strings."""

import struct

import numpy as np

from contract import OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES
from contract.ranking import top_k
from serve.classify import float32_list, label_names

_LITTLE_ENDIAN = {"FP32": "<f4", "INT64": "<i8", "BOOL": "|b1"}
#: Outputs only some models have (contract.OUTPUT_OOD_SCORE, OUTPUT_IN_DISTRIBUTION), with their datatypes.
CONFIDENCE_OUTPUTS = {OUTPUT_OOD_SCORE: "FP32", OUTPUT_IN_DISTRIBUTION: "BOOL"}


def output_names(meta):
    """The outputs this model answers: the three every model has, then those of :data:`CONFIDENCE_OUTPUTS` it has.

    Which it has comes with the backend's metadata (``confidence_outputs``, worked out once per
    loaded version with :func:`serve.signatures.confidence_outputs`), not from the signatures on every request.
    """
    return [OUTPUT_PROBABILITIES, OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, *meta["confidence_outputs"]]


def output_tensors(meta, outputs):
    """``{output name: (datatype, array)}`` from the backend's answer."""
    probabilities = np.asarray(outputs[OUTPUT_PROBABILITIES], np.float32)
    if OUTPUT_CLASS_IDS in outputs:
        class_ids = np.asarray(outputs[OUTPUT_CLASS_IDS], np.int64)
    else:
        class_ids = np.argmax(probabilities, axis=1).astype(np.int64)
    if OUTPUT_CLASS_NAMES in outputs:
        class_names = np.asarray(outputs[OUTPUT_CLASS_NAMES], dtype=object)
    else:
        names = label_names(meta, outputs, probabilities.shape[1])
        class_names = np.array([names[c].encode() for c in class_ids.tolist()], dtype=object)
    tensors = {
        OUTPUT_PROBABILITIES: ("FP32", probabilities),
        OUTPUT_CLASS_IDS: ("INT64", class_ids),
        OUTPUT_CLASS_NAMES: ("BYTES", class_names),
    }
    for key, datatype in CONFIDENCE_OUTPUTS.items():
        if key in outputs:
            tensors[key] = (datatype, np.asarray(outputs[key], _LITTLE_ENDIAN[datatype]))
    return tensors


def classification(meta, outputs, tensors, k):
    """The classification extension: BYTES ``[N, k]`` of ``"<probability>:<class id>:<label>"``, best first."""
    probabilities = tensors[OUTPUT_PROBABILITIES][1]
    names = label_names(meta, outputs, probabilities.shape[1])
    order, best = top_k(probabilities, k)
    k = order.shape[1]
    values = float32_list(best)
    rows = [
        [f"{p}:{c}:{names[c]}".encode() for p, c in zip(row_values, row_ids)]
        for row_values, row_ids in zip(values, order.tolist())
    ]
    return np.array(rows, dtype=object).reshape(len(rows), k)


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
