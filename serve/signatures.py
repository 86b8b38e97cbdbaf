"""Signature definitions as TF Serving writes them in JSON, and the small summary /api/v1/model shows."""

import numpy as np

from contract import OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, SIGNATURE_PIXELS

INIT_OP = "__saved_model_init_op"
#: Outputs only some models have: how foreign each image looks (contract.OUTPUT_OOD_SCORE, OUTPUT_IN_DISTRIBUTION).
CONFIDENCE_OUTPUTS = (OUTPUT_OOD_SCORE, OUTPUT_IN_DISTRIBUTION)

#: TF Serving's DT_* names for the dtypes this server converts.
NUMPY_DTYPES = {
    "DT_FLOAT": np.float32,
    "DT_DOUBLE": np.float64,
    "DT_HALF": np.float16,
    "DT_UINT8": np.uint8,
    "DT_INT8": np.int8,
    "DT_UINT16": np.uint16,
    "DT_INT16": np.int16,
    "DT_INT32": np.int32,
    "DT_UINT32": np.uint32,
    "DT_INT64": np.int64,
    "DT_UINT64": np.uint64,
    "DT_BOOL": np.bool_,
    "DT_STRING": object,
}


def signature_defs_json(saved_model_pb):
    """``{name: signature_def}`` of a ``saved_model.pb`` in TF Serving's metadata JSON form."""
    from tfs_protos.tensorflow_serving.apis import get_model_metadata_pb2

    with open(saved_model_pb, "rb") as f:
        saved = _saved_model_message().FromString(f.read())
    defs = get_model_metadata_pb2.SignatureDefMap()
    for name, sig in saved.meta_graphs[0].signature_def.items():
        if name != INIT_OP:
            defs.signature_def[name].CopyFrom(sig)
    return signature_def_map_json(defs)


def _saved_model_message():
    """The ``tensorflow.SavedModel`` message class, generated with the other vendored protos (no TensorFlow)."""
    from tfs_protos.tensorflow.core.protobuf import saved_model_pb2

    return saved_model_pb2.SavedModel


def signature_def_map_json(defs):
    """A ``SignatureDefMap`` proto as TF Serving's REST metadata shows it."""
    from google.protobuf import json_format

    as_dict = json_format.MessageToDict(defs, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return {name: sig for name, sig in as_dict.get("signature_def", {}).items() if name != INIT_OP}


def summary(signature_defs):
    """``{name: {"inputs": {key: {"dtype", "shape"}}, "outputs": {...}}}`` from TF Serving JSON."""

    def tensors(infos):
        out = {}
        for key, info in sorted(infos.items()):
            shape = info.get("tensor_shape", {})
            dims = None if shape.get("unknown_rank") else [int(d.get("size", -1)) for d in shape.get("dim", [])]
            out[key] = {"dtype": info.get("dtype", "DT_INVALID").removeprefix("DT_").lower(), "shape": dims}
        return out

    return {
        name: {"inputs": tensors(sig.get("inputs", {})), "outputs": tensors(sig.get("outputs", {}))}
        for name, sig in sorted(signature_defs.items())
    }


def confidence_outputs(signature_defs):
    """Which of :data:`CONFIDENCE_OUTPUTS` the ``serving_default`` signature answers, in that order.

    A fact of the loaded version: the backends put it in their metadata when they build it, so
    no request has to read the signatures again to learn it.
    """
    have = (signature_defs or {}).get(SIGNATURE_PIXELS, {}).get("outputs", {})
    return tuple(key for key in CONFIDENCE_OUTPUTS if key in have)


def tensor_specs(signature_def):
    """``{input key: (numpy dtype, shape with None for unknown dims or None)}`` of one signature."""
    specs = {}
    for key, info in signature_def.get("inputs", {}).items():
        shape = info.get("tensor_shape", {})
        dims = None if shape.get("unknown_rank") else [None if int(d.get("size", -1)) < 0 else int(d["size"]) for d in shape.get("dim", [])]
        specs[key] = (NUMPY_DTYPES.get(info.get("dtype")), dims)
    return specs


def output_dtypes(signature_def):
    return {key: NUMPY_DTYPES.get(info.get("dtype")) for key, info in signature_def.get("outputs", {}).items()}


def check_inputs(signature_name, specs, inputs):
    """Raise ``ValueError`` (a 400) unless ``inputs`` match the signature's ``specs`` (:func:`tensor_specs`): keys, dtypes and shapes."""
    if set(inputs) != set(specs):
        raise ValueError(f"signature {signature_name!r} takes inputs {sorted(specs)}, got {sorted(inputs)}")
    for key, value in inputs.items():
        dtype, dims = specs[key]
        if dtype is not None and value.dtype != np.dtype(dtype):
            raise ValueError(f"input {key!r} must be {np.dtype(dtype).name}, got {value.dtype.name}")
        if dims is not None and (
            value.ndim != len(dims) or any(d is not None and d != s for d, s in zip(dims, value.shape))
        ):
            want = [-1 if d is None else d for d in dims]
            raise ValueError(f"input {key!r} must have shape {want}, got {list(value.shape)}")
