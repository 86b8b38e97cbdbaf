"""A model's signatures, read from a ``saved_model.pb`` or a TF Serving's ``SignatureDefMap`` into the core's types."""

from serve.core.model import Signature

INIT_OP = "__saved_model_init_op"


def of_saved_model(saved_model_pb):
    """``{name: Signature}`` of a ``saved_model.pb``, read through the vendored protos (no TensorFlow)."""
    from tfs_protos.tensorflow.core.protobuf import saved_model_pb2

    with open(saved_model_pb, "rb") as f:
        saved = saved_model_pb2.SavedModel.FromString(f.read())
    return of_signature_defs(saved.meta_graphs[0].signature_def)


def of_signature_defs(defs):
    """``{name: Signature}`` of a map of ``SignatureDef`` protos (a ``SignatureDefMap``'s ``signature_def``)."""
    from google.protobuf import json_format

    return {name: Signature.from_json(json_format.MessageToDict(
        sig, preserving_proto_field_name=True, always_print_fields_with_no_presence=True))
            for name, sig in defs.items() if name != INIT_OP}


def of_json(defs):
    """``{name: Signature}`` of TF Serving's metadata JSON (``metadata.signature_def.signature_def``)."""
    return {name: Signature.from_json(sig) for name, sig in defs.items() if name != INIT_OP}
