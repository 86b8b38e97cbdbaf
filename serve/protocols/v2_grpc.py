"""The Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService``, as Triton and
KServe serve it, so ``tritonclient.grpc`` (and KServe's, MLServer's or OpenVINO's v2 gRPC clients) work
against this server unchanged.

``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata`` and ``ModelInfer``,
on the ``grpc.server`` that :func:`serve.protocols.tfserving_grpc.make_server` starts in every worker
(one ``GRPC_PORT`` for both gRPC APIs and health), behind the same :class:`~serve.protocols.grpc_guard.Guard`
(API keys in the metadata, the ``api`` area's rate limit shared with HTTP), the same receive limit and
the same error edge (a :class:`~serve.core.errors.ServeError` leaves as its status code and message;
deadlines and cancellation checked between the stages).

It is :mod:`serve.protocols.v2_rest` in gRPC's framing, and reads and writes tensors with the same
code: an input tensor, in ``raw_input_contents`` or in its typed field (``uint_contents`` for UINT8
``images`` ``[N, 32, 32, 3]``, ``bytes_contents`` for BYTES ``image_bytes`` ``[N]``, encoded images the
core decodes), is laid out as the HTTP binary extension's bytes and read by
:func:`serve.protocols.v2_request.read_input`, so a datatype, shape or size is refused in the same words;
``outputs[].parameters.classification`` is the classification extension, as over HTTP. Outputs always
go in ``raw_output_contents``, as Triton answers and as ``tritonclient.grpc``'s ``InferResult.as_numpy``
reads them (it reads typed contents for BYTES only). The answer's ``model_version`` names the version
that answered.

Typical usage (``tfserving_grpc.make_server`` does this)::

    add_to_server(server, app)
"""

import struct

import numpy as np

from serve.core import ServeError
from serve.protocols import tfserving_grpc
from serve.protocols.v2_request import Binary, read_input, requested_outputs
from serve.protocols.v2_response import classification, output_tensors, to_binary
from serve.protocols.v2_rest import SERVER_NAME, metadata, server_version
from tfs_protos.inference import grpc_predict_v2_pb2 as pb, grpc_predict_v2_pb2_grpc

#: The protocol's extensions over gRPC (binary tensor data is HTTP's framing; gRPC has raw contents).
EXTENSIONS = ("classification",)
#: The typed field of ``InferTensorContents`` each input datatype's values go in.
TYPED_FIELDS = {"UINT8": "uint_contents", "BYTES": "bytes_contents"}

edge = tfserving_grpc._edge  # the TF Serving adapter's one exit for errors: status codes, never UNKNOWN
alive = tfserving_grpc.alive


def add_to_server(server, app):
    """Serve ``inference.GRPCInferenceService`` over ``app``'s service and readiness on ``server``."""
    grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(GRPCInferenceService(app), server)


class GRPCInferenceService(grpc_predict_v2_pb2_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over one app's :class:`~serve.core.service.InferenceService`.

    Each call runs in the app's context, so the request parser of :mod:`serve.protocols.v2_request`
    finds the app's service and settings as it does over HTTP.
    """

    def __init__(self, app):
        self.app = app
        self.service = app.extensions["serve.service"]
        self.readiness = app.extensions["serve.readiness"]

    def _ready(self):
        try:
            self.readiness.check()  # serve.health: at most one probe prediction a second
        except ServeError:
            return False
        return True

    @edge
    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    @edge
    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self._ready())

    @edge
    def ModelReady(self, request, context):
        self.service.model(request.name, request.version or None)  # NOT_FOUND, as HTTP's 404
        return pb.ModelReadyResponse(ready=self._ready())

    @edge
    def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=server_version(), extensions=EXTENSIONS)

    @edge
    def ModelMetadata(self, request, context):
        described = metadata(request.name, self.service.model(request.name, request.version or None))
        response = pb.ModelMetadataResponse(name=described["name"], versions=described["versions"],
                                            platform=described["platform"])
        for field in ("inputs", "outputs"):
            for tensor in described[field]:
                getattr(response, field).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        return response

    @edge
    def ModelInfer(self, request, context):
        name, version = request.model_name, request.model_version or None
        with self.app.app_context():
            info = self.service.model(name, version)
            payload, binary = _as_http(request)
            pixels = read_input(payload, binary)
            wanted = requested_outputs(payload, info.outputs)
        alive(context)
        answer = self.service.infer(pixels, name, version, info=info)  # names the version that answered, across a swap too
        alive(context)
        tensors = output_tensors(answer.model, answer.outputs)
        response = pb.ModelInferResponse(model_name=name, model_version="" if answer.version is None else str(answer.version),
                                         id=request.id)
        for output, parameters in wanted:
            datatype, array = tensors[output]
            if parameters.get("classification"):
                datatype, array = "BYTES", classification(self.service.top_k(answer, parameters["classification"]))
            response.outputs.add(name=output, datatype=datatype, shape=list(array.shape))
            response.raw_output_contents.append(to_binary(datatype, array))
        return response


def _as_http(request):
    """``(payload, binary)`` as :func:`read_input` and :func:`requested_outputs` read an HTTP request with binary data.

    Every input's values become its binary data, raw contents as they came and typed contents laid out
    the same way, so one parser checks them all.
    """
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ServeError(f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs: "
                         "one for each input, in the order of inputs")
    inputs, blobs = [], []
    for index, tensor in enumerate(request.inputs):
        if raw and tensor.HasField("contents"):
            raise ServeError(f"input {tensor.name!r} has contents, but the request sends raw_input_contents: "
                             "send one or the other")
        data = raw[index] if raw else _typed(tensor)
        parameters = {"binary_data_size": len(data), **_parameters(tensor.parameters)}
        inputs.append({"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape), "parameters": parameters})
        blobs.append(data)
    outputs = [{"name": output.name, "parameters": _parameters(output.parameters)} for output in request.outputs]
    return {"inputs": inputs, "outputs": outputs}, Binary(b"".join(blobs))


def _typed(tensor):
    """A tensor's typed contents laid out as its raw bytes (UINT8: a byte a value; BYTES: a length, then the bytes)."""
    field = TYPED_FIELDS.get(tensor.datatype)
    contents = tensor.contents
    given = [f.name for f, _ in contents.ListFields()]
    if field is None or given not in ([], [field]):
        expected = "; ".join(f"{datatype} in contents.{name}" for datatype, name in TYPED_FIELDS.items())
        raise ServeError(f"input {tensor.name!r} is {tensor.datatype or 'of no datatype'} with values in "
                         f"{', '.join(given) or 'no field'}: this server reads {expected}, or raw_input_contents")
    if field == "bytes_contents":
        return b"".join(struct.pack("<I", len(value)) + value for value in contents.bytes_contents)
    values = np.asarray(contents.uint_contents, np.uint32)
    if values.size and values.max() > 255:
        raise ServeError(f"input {tensor.name!r} has values outside the UINT8 range 0..255")
    return values.astype(np.uint8).tobytes()


def _parameters(parameters):
    """A parameters map as the HTTP parser reads one: ``{name: bool, int or str}`` (the ones it knows)."""
    known = {}
    for key in ("classification", "shared_memory_region"):  # the extension, and the one the parser refuses
        if key in parameters:
            kind = parameters[key].WhichOneof("parameter_choice")
            known[key] = None if kind is None else getattr(parameters[key], kind)
    return known

