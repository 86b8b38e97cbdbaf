"""The Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService``, as Triton and KServe serve
it, so ``tritonclient.grpc`` (and KServe's, MLServer's or OpenVINO's v2 gRPC clients) work against this server unchanged.

``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata`` and ``ModelInfer``, on the
``grpc.server`` of :mod:`serve.grpc.server` (one ``GRPC_PORT`` for both gRPC APIs and health). An input tensor,
in ``raw_input_contents`` (packed, as HTTP's binary extension packs it) or in its typed field (``uint_contents``
for UINT8, ``bytes_contents`` for BYTES), becomes a :class:`~serve.core.request.Tensor` as it came; the core
checks it, in the protocol's words for types, as over HTTP. Outputs always go in ``raw_output_contents``, as
Triton answers and as ``tritonclient.grpc``'s ``InferResult.as_numpy`` reads them (it reads typed contents for
BYTES only); ``parameters.classification`` is the classification extension. The answer's ``model_version``
names the version that answered.
"""

from serve.core.errors import BadRequest, echo
from serve.grpc.edge import edge, grpc_request
from serve.protocols import v2
from tfs_protos.inference import grpc_predict_v2_pb2 as pb, grpc_predict_v2_pb2_grpc

#: The protocol's extensions over gRPC (binary tensor data is HTTP's framing; gRPC has raw contents).
EXTENSIONS = ("classification",)
#: The typed field of ``InferTensorContents`` each input datatype's values go in.
TYPED_FIELDS = {"UINT8": "uint_contents", "BYTES": "bytes_contents"}


def add_to_server(server, service):
    """Serve ``inference.GRPCInferenceService`` over ``service`` on ``server``."""
    grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(GRPCInferenceService(service), server)


class GRPCInferenceService(grpc_predict_v2_pb2_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over one :class:`~serve.core.service.InferenceService`."""

    def __init__(self, service):
        self.service = service

    def _ready(self):
        try:
            self.service.ready()  # the core's probe: at most one model call a second
        except Exception:  # any refusal means "not ready"
            return False
        return True

    @edge()
    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    @edge()
    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self._ready())

    @edge()
    def ModelReady(self, request, context):
        self.service.model(request.name, request.version or None)  # NOT_FOUND, as HTTP's 404
        return pb.ModelReadyResponse(ready=self._ready())

    @edge()
    def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name=v2.SERVER_NAME, version=v2.server_version(), extensions=EXTENSIONS)

    @edge()
    def ModelMetadata(self, request, context):
        described = v2.metadata(request.name, self.service.model(request.name, request.version or None))
        response = pb.ModelMetadataResponse(name=described["name"], versions=described["versions"],
                                            platform=described["platform"])
        for field in ("inputs", "outputs"):
            for tensor in described[field]:
                getattr(response, field).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        return response

    @edge()
    def ModelInfer(self, request, context):
        inputs, wanted = decode(request)
        answer = self.service.infer(grpc_request(context, inputs, model_name=request.model_name,
                                                 version=request.model_version or None, signature=v2.signature_of(inputs),
                                                 outputs=v2.names(wanted), dtype_names=v2.NAMES))
        return encode(answer, wanted, request)


def decode(request):
    """``({name: Tensor}, [Wanted])`` of a ``ModelInferRequest``."""
    return _inputs(request), v2.wanted_outputs([(output.name, _parameters(output.parameters)) for output in request.outputs],
                                               True)


def encode(answer, wanted, request):
    """The ``ModelInferResponse`` to ``request``: every output asked for (all, when none is) in ``raw_output_contents``."""
    response = pb.ModelInferResponse(model_name=request.model_name, id=request.id,
                                     model_version="" if answer.version is None else str(answer.version))
    for output, datatype, array in v2.answer_tensors(answer, wanted or v2.every_output(answer, True)):
        response.outputs.add(name=output, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(v2.to_binary(datatype, array))
    return response


def _inputs(request):
    """``{name: Tensor}``: each input with its raw contents (in the order of the inputs) or its typed contents."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs: "
                         "one for each input, in the order of inputs")
    inputs = {}
    for index, given in enumerate(request.inputs):
        if given.name in inputs:
            raise BadRequest(f"input {echo(given.name)} is given twice")
        v2.check_parameters(f"input {echo(given.name)}", _parameters(given.parameters))
        if raw:
            if given.HasField("contents"):
                raise BadRequest(f"input {echo(given.name)} has contents, but the request sends raw_input_contents: "
                                 "send one or the other")
            inputs[given.name] = v2.tensor(given.name, given.datatype, list(given.shape), raw[index], packed=True,
                                           field="raw_input_contents")
        else:
            inputs[given.name] = v2.tensor(given.name, given.datatype, list(given.shape), _typed(given))
    return inputs


def _typed(tensor):
    """A tensor's values from the typed field of its datatype (UINT8's ``uint_contents``, BYTES' ``bytes_contents``)."""
    field = TYPED_FIELDS.get(tensor.datatype)
    given = [f.name for f, _ in tensor.contents.ListFields()]
    if field is None or given not in ([], [field]):
        expected = "; ".join(f"{datatype} in contents.{name}" for datatype, name in TYPED_FIELDS.items())
        raise BadRequest(f"input {echo(tensor.name)} is {echo(tensor.datatype) if tensor.datatype else 'of no datatype'} "
                         f"with values in {', '.join(given) or 'no field'}: this server reads {expected}, or raw_input_contents")
    return getattr(tensor.contents, field)


def _parameters(parameters):
    """A parameters map as the protocol's values: ``{name: bool, int or str}``."""
    known = {}
    for key in parameters:
        kind = parameters[key].WhichOneof("parameter_choice")
        known[key] = None if kind is None else getattr(parameters[key], kind)
    return known
