"""TF Serving's gRPC API, so a client written for ``tensorflow-serving-api``'s stubs works unchanged.

* ``tensorflow.serving.PredictionService``: ``Predict`` (tensors in ``tensor_content`` or the typed ``*_val``
  fields, any signature of the model, ``output_filter``), ``Classify`` (``tf.Example`` s holding one encoded image
  each in their ``image_bytes`` feature, every class with its probability) and ``GetModelMetadata`` (the model's
  real ``SignatureDefMap``);
* ``tensorflow.serving.ModelService``: ``GetModelStatus`` (every version the server knows, with its state).

Each ``TensorProto`` becomes a :class:`~serve.core.request.Tensor` as it came (packed bytes, or its typed values
with TensorFlow's rule that a shorter list repeats its last value), ``model_spec`` the request's model, version
or label; the core checks and answers, as it does TF Serving's REST API (:mod:`serve.protocols.tfserving_rest`),
so the two give the same numbers. A model or version it does not serve is ``NOT_FOUND`` in TF Serving's words.
The server, its interceptors and its error edge are :mod:`serve.grpc`'s.
"""

import grpc
import numpy as np
from google.protobuf import json_format

from contract import INPUT_BYTES, SIGNATURE_BYTES, SIGNATURE_PIXELS
from serve.core.errors import BadRequest, NotServed, echo
from serve.core.model import DTYPES
from serve.core.request import BYTES, Tensor
from serve.grpc.edge import Failure, edge, grpc_request
from serve.protocols import tfserving
from tfs_protos import tensors
from tfs_protos.tensorflow.core.framework import types_pb2
from tfs_protos.tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                                model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc)


def _words(e):
    """A refusal as TF Serving words it: its own words for a model or version it does not serve, else the core's."""
    return f"{tfserving.not_found(e)} ({e})" if isinstance(e, NotServed) else str(e)


tf_edge = edge(_words)


def requested(model_spec):
    """``(name, version, label)`` of a ``ModelSpec``: the version it names by number or by label, or neither (None)."""
    choice = model_spec.WhichOneof("version_choice")
    return (model_spec.name, model_spec.version.value if choice == "version" else None,
            model_spec.version_label if choice == "version_label" else None)


def tensor(key, proto):
    """A ``TensorProto`` as the :class:`Tensor` it carries: its declared shape and type, and its values as they came."""
    if proto.tensor_shape.unknown_rank:
        raise BadRequest(f"input {echo(key)} has an unknown rank")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    name = _dtype_name(proto.dtype)
    dtype = DTYPES.get(name)
    if dtype is None:
        raise BadRequest(f"input {echo(key)} is a {name} tensor, which this server does not read")
    if dtype == object:
        return Tensor(proto.string_val, shape, BYTES, fill_last=True)
    if proto.tensor_content:
        return Tensor(proto.tensor_content, shape, dtype.name, packed=True, field="tensor_content")
    values = getattr(proto, tensors.typed_field(proto.dtype))
    if dtype == np.float16:  # half_val holds the raw 16-bit patterns as ints
        values = np.asarray(values, dtype=np.uint16).view(np.float16)
    return Tensor(values, shape, dtype.name, fill_last=True)


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``tensorflow.serving.PredictionService`` over one :class:`~serve.core.service.InferenceService`."""

    def __init__(self, service):
        self.service = service

    @tf_edge
    def Predict(self, request, context):
        name, version, label = requested(request.model_spec)
        signature = request.model_spec.signature_name or SIGNATURE_PIXELS
        inputs = {key: tensor(key, proto) for key, proto in request.inputs.items()}
        answer = self.service.infer(grpc_request(context, inputs, model_name=name, version=version, label=label,
                                                 signature=signature, outputs=tuple(request.output_filter) or None))
        return predict_response(answer, name, signature)

    @tf_edge
    def Classify(self, request, context):
        name, version, label = requested(request.model_spec)
        signature = request.model_spec.signature_name
        if signature not in ("", SIGNATURE_BYTES):
            raise BadRequest(f"Classify reads encoded images, by signature {SIGNATURE_BYTES!r}; got {echo(signature)}")
        kind = request.input.WhichOneof("kind")
        if kind != "example_list":
            raise BadRequest("Classify takes input.example_list: tf.Examples each holding one encoded image in its "
                             f"{INPUT_BYTES!r} feature" + ("" if kind is None else f" (not {kind})"))
        images = []
        for index, example in enumerate(request.input.example_list.examples):
            feature = example.features.feature.get(INPUT_BYTES)
            values = feature.bytes_list.value if feature is not None else ()
            if len(values) != 1:
                raise BadRequest(f"example {index} must hold one encoded image in its {INPUT_BYTES!r} bytes feature, "
                                 f"holds {len(values)}")
            images.append(values[0])
        inputs = {INPUT_BYTES: Tensor(images, (len(images),), BYTES)}
        answer = self.service.infer(grpc_request(context, inputs, model_name=name, version=version, label=label,
                                                 signature=SIGNATURE_BYTES))
        response = classification_pb2.ClassificationResponse()
        _spec(response.model_spec, name, answer.version, SIGNATURE_BYTES)
        classes = answer.model.num_classes
        for ranked in answer.ranked(classes if classes > 0 else None):
            row = response.result.classifications.add().classes
            for entry in ranked:
                row.add(label=entry.label, score=entry.probability)
        return response

    @tf_edge
    def GetModelMetadata(self, request, context):
        fields = list(request.metadata_field)
        if not fields:
            raise BadRequest("GetModelMetadataRequest must specify at least one metadata_field")
        for field in fields:
            if field != "signature_def":
                raise BadRequest(f"Metadata field {echo(field)} is not supported")
        name, version, label = requested(request.model_spec)
        info = self.service.model(name, version, label)
        defs = get_model_metadata_pb2.SignatureDefMap()
        json_format.ParseDict(tfserving.metadata(info), defs)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        _spec(response.model_spec, name, info.version, None)
        response.metadata["signature_def"].Pack(defs)
        return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """``tensorflow.serving.ModelService``: the versions this server answers for."""

    def __init__(self, service):
        self.service = service

    @tf_edge
    def GetModelStatus(self, request, context):
        name, version, label = requested(request.model_spec)
        if name != self.service.model_name:
            raise Failure(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {tfserving.bounded(name)}")
        try:
            info = self.service.model(name, version, label)
        except NotServed as e:
            if e.label is not None:
                raise
            raise Failure(grpc.StatusCode.NOT_FOUND, f"Could not find version {tfserving.bounded(version)} of model "
                          f"{tfserving.bounded(name)}") from None
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, state in tfserving.states(info, version is not None or label is not None):
            entry = response.model_version_status.add()
            entry.version = int(number)
            entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
            entry.status.error_code = 0  # tensorflow.error.OK
        return response

    @tf_edge
    def HandleReloadConfigRequest(self, request, context):
        raise Failure(grpc.StatusCode.UNIMPLEMENTED, "this server reads its model config from SERVE_MODEL_CONFIG_FILE, "
                      "again whenever it changes; edit that file instead")


def predict_response(answer, name, signature):
    """The ``PredictResponse`` of an answer: its outputs (those asked for, when some were) as ``TensorProto`` s."""
    response = predict_pb2.PredictResponse()
    _spec(response.model_spec, name, answer.version, signature)
    for key in answer.outputs:
        response.outputs[key].CopyFrom(tensors.to_proto(np.asarray(answer.outputs[key])))
    return response


def add_to_server(server, service):
    """Serve TF Serving's ``PredictionService`` and ``ModelService`` over ``service`` on ``server``."""
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(service), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(service), server)


def _spec(spec, name, version, signature):
    spec.name = name
    if version is not None:
        spec.version.value = version
    if signature is not None:
        spec.signature_name = signature


def _dtype_name(enum):
    try:
        return types_pb2.DataType.Name(enum)
    except ValueError:
        return f"DT_{enum}"
