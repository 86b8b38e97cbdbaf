"""What the Open Inference Protocol (KServe v2) says the same over HTTP and gRPC: its datatypes, the model's
inputs and outputs in its terms, the request each inference becomes, and the output tensors of an answer.

The model takes one of two inputs in a request: ``images``, UINT8 ``[N, 32, 32, 3]`` raw RGB pixels (the
``serving_default`` signature), or ``image_bytes``, BYTES ``[N]`` encoded images (``predict_images``: the
core decodes them as it decodes ``/api/v1/predict``'s uploads). It answers ``probabilities`` (FP32 ``[N, C]``),
``class_ids`` (INT64 ``[N]``), ``class_names`` (BYTES ``[N]``) and the confidence outputs the model has;
``parameters.classification`` on ``probabilities`` is the classification extension (top k as strings).
"""

import importlib.metadata
import struct
import typing

import numpy as np

from contract import (CHANNELS, IMAGE_SIZE, INPUT_BYTES, INPUT_PIXELS, OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, OUTPUT_IN_DISTRIBUTION,
                      OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES, SIGNATURE_BYTES, SIGNATURE_PIXELS)
from serve.core.errors import BadRequest, echo
from serve.core.request import BYTES, Tensor

SERVER_NAME = "cifar-tpu-pipeline"
#: What ``platform`` says: Triton's name for a SavedModel (TF Serving runs one too), else the runtime's own name.
SAVEDMODEL_PLATFORM = "tensorflow_savedmodel"
#: The protocol's datatypes, as the numpy type names of :class:`~serve.core.request.Tensor` (BYTES: byte strings).
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64", "INT8": "int8",
             "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16", "FP32": "float32",
             "FP64": "float64", "BYTES": BYTES}
#: How the protocol names each numpy type in its refusals ("must have datatype UINT8").
NAMES = {np.dtype(object if dtype == BYTES else dtype): name for name, dtype in DATATYPES.items()}
#: The inputs the model takes, each the one input of a signature: ``{name: (datatype, shape, signature)}``.
INPUTS = {
    INPUT_PIXELS: ("UINT8", [-1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS], SIGNATURE_PIXELS),
    INPUT_BYTES: ("BYTES", [-1], SIGNATURE_BYTES),
}
_LITTLE_ENDIAN = {"FP32": "<f4", "INT64": "<i8", "BOOL": "|b1"}
#: The numpy type of each output datatype (this machine's order: the binary extension writes little-endian).
_NUMPY = {"FP32": np.dtype(np.float32), "INT64": np.dtype(np.int64), "BOOL": np.dtype(np.bool_), "BYTES": np.dtype(object)}
#: The protocol's datatype of each output.
OUTPUT_DATATYPES = {OUTPUT_PROBABILITIES: "FP32", OUTPUT_CLASS_IDS: "INT64", OUTPUT_CLASS_NAMES: "BYTES",
                    OUTPUT_OOD_SCORE: "FP32", OUTPUT_IN_DISTRIBUTION: "BOOL"}


class Wanted(typing.NamedTuple):
    """An output a request asks for, and how: as binary data (HTTP), or ranked to its top ``classification``."""

    name: str
    binary: bool = False
    classification: int = 0


def server_version():
    """This server's package version, as the protocol's server metadata names it (HTTP and gRPC)."""
    try:
        return importlib.metadata.version(SERVER_NAME)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def tensor(name, datatype, shape, values, packed=False, field="its binary data"):
    """A :class:`Tensor` of an input as the protocol declares it (an unknown datatype refused in its terms)."""
    if datatype not in DATATYPES:
        raise BadRequest(f"input {echo(name)}: datatype {echo(datatype)} is not one of the protocol's "
                         f"({', '.join(DATATYPES)})")
    return Tensor(values, shape=tuple(shape) if isinstance(shape, list) else shape, dtype=DATATYPES[datatype], packed=packed,
                  field=field)


def signature_of(inputs):
    """The signature a request's inputs call: ``predict_images`` for ``image_bytes`` alone, else ``serving_default``
    (whose one input, ``images``, the core then holds the request's inputs to)."""
    return SIGNATURE_BYTES if list(inputs) == [INPUT_BYTES] else SIGNATURE_PIXELS


def wanted_outputs(requested, binary_default):
    """``[Wanted]``: the outputs asked for, each with its parameters (``[]``: none named, so every output).

    ``requested``: ``[(name, parameters)]``, the parameters as a dict of the protocol's values.
    """
    wanted = []
    for name, parameters in requested:
        binary = parameters.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise BadRequest(f"output {echo(name)}: binary_data must be true or false")
        k = parameters.get("classification", 0)
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise BadRequest(f"output {echo(name)}: classification must be a whole number of classes, got {echo(k)}")
        if k and name != OUTPUT_PROBABILITIES:
            raise BadRequest(f"classification applies to {OUTPUT_PROBABILITIES!r}, not {echo(name)}")
        wanted.append(Wanted(name, binary, k))
    return wanted


def names(wanted):
    """The output names a request asks the core for (None: every one), each once."""
    return tuple(dict.fromkeys(want.name for want in wanted)) or None


def every_output(answer, binary):
    """``[Wanted]`` of every output of an answer to a request that named none, in the model's order."""
    return [Wanted(name, binary) for name in answer.model.outputs if name in answer.outputs]


def check_parameters(what, parameters):
    """A tensor's parameters; the shared-memory extension is refused."""
    if not isinstance(parameters, dict):
        raise BadRequest(f"{what}: parameters must be an object")
    if "shared_memory_region" in parameters:
        raise BadRequest("this server does not implement the shared-memory extension; send the data in the request")
    return parameters


def answer_tensors(answer, wanted):
    """``[(name, datatype, array)]`` of the outputs asked for, from the core's answer (classification ranked here)."""
    tensors = []
    for want in wanted:
        if want.classification:
            tensors.append((want.name, "BYTES", classification(answer.ranked(want.classification))))
            continue
        datatype = OUTPUT_DATATYPES[want.name]
        array = answer.outputs[want.name]
        kind = _NUMPY[datatype]
        tensors.append((want.name, datatype, array if array.dtype == kind else np.asarray(array, kind)))
    return tensors


def classification(ranked):
    """The classification extension: BYTES ``[N, k]`` of ``"<probability>:<class id>:<label>"``, best first."""
    rows = [[f"{r.probability}:{r.class_id}:{r.label}".encode() for r in row] for row in ranked]
    return np.array(rows, dtype=object).reshape(len(rows), len(rows[0]) if rows else 0)


def to_json(datatype, array):
    """A tensor's ``data`` in JSON, flat: text for BYTES, else the array itself (the JSON provider writes it)."""
    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.ravel().tolist()]
    return array.ravel()  # written by the JSON provider (a copy only if it is not contiguous)


def to_binary(datatype, array):
    if datatype == "BYTES":
        parts = []
        for value in array.ravel().tolist():
            value = value if isinstance(value, bytes) else str(value).encode()
            parts += [struct.pack("<I", len(value)), value]
        return b"".join(parts)
    return np.ascontiguousarray(array, _LITTLE_ENDIAN[datatype]).tobytes()


def metadata(name, info):
    """A model's metadata as the protocol describes it (HTTP and gRPC): versions, platform, inputs, outputs."""
    runtime = info.runtime  # the local backend's (litert, litert-int8, savedmodel); none for TF Serving
    return {
        "name": name,
        "versions": [str(v) for v in info.versions],
        "platform": SAVEDMODEL_PLATFORM if runtime in (None, "savedmodel") else runtime,
        "inputs": [{"name": key, "datatype": datatype, "shape": shape} for key, (datatype, shape, _) in INPUTS.items()],
        "outputs": [{"name": key, "datatype": OUTPUT_DATATYPES[key],
                     "shape": [-1, info.num_classes] if key == OUTPUT_PROBABILITIES else [-1]} for key in info.outputs],
    }
