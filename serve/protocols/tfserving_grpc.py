"""TF Serving's gRPC API, so a client written for ``tensorflow-serving-api``'s stubs works unchanged.

Two services, as TF Serving serves them, plus the standard health service:

* ``tensorflow.serving.PredictionService``: ``Predict`` (tensors in ``tensor_content`` or the typed
  ``*_val`` fields, any signature of the model, ``output_filter``), ``Classify`` (``tf.Example``\\ s
  holding one encoded image each in their ``image_bytes`` feature, every class with its probability)
  and ``GetModelMetadata`` (the model's real ``SignatureDefMap``);
* ``tensorflow.serving.ModelService``: ``GetModelStatus`` (every served version, ``AVAILABLE``);
* ``grpc.health.v1.Health``: ``Check`` and ``Watch``, ``SERVING`` once the model answered a probe
  (the HTTP ``/readyz``'s answer), for Kubernetes' gRPC probes. It needs no key, like ``/readyz``.

Every call is translated to :class:`serve.core.service.InferenceService` the way
:mod:`serve.protocols.tfserving_rest` translates TF Serving's REST calls (``model_spec.version``
or ``version_label`` through ``model``/``run``; the answer's ``model_spec`` names the version that answered), so the two
give the same numbers and every per-image metric moves alike. The guards are HTTP's (:class:`~serve.protocols.grpc_guard.Guard`): the
API area's rate limit, one budget with HTTP's; the API keys of :mod:`serve.security` in the call's
metadata (``authorization: Bearer KEY`` or ``x-api-key: KEY``), compared by the same function; the
image cap and pixel budget of the core; the largest message
(``SERVE_MAX_UPLOAD_MB``, enforced by gRPC itself); the caller's deadline and cancellation, checked
between the stages of a call (the model call itself runs to its end: the core has no deadline yet).

Errors leave as gRPC status codes with the core's message, never ``UNKNOWN``: see :data:`CODES`.
A request over the image cap (HTTP's 413) is ``INVALID_ARGUMENT``, as TF Serving answers a batch
over its ``max_batch_size``: it fails however often it is retried, while ``RESOURCE_EXHAUSTED``, which
gRPC itself gives a message over the size limit, is one that retry policies treat as transient.

Typical usage (``serve/gunicorn_conf.py`` starts one in every worker, over that worker's app)::

    server, port = make_server(app, "0.0.0.0:8500")
    server.start()
"""

import functools
import logging
import threading
from concurrent import futures

import grpc
import numpy as np
from google.protobuf import json_format

from contract import INPUT_BYTES, SIGNATURE_BYTES, SIGNATURE_PIXELS
from serve import signatures, tracing
from serve.core import NotServed, ServeError
from tfs_protos import tensors
from tfs_protos.grpc_health.v1 import health_pb2, health_pb2_grpc
from tfs_protos.tensorflow.core.framework import types_pb2
from tfs_protos.tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

log = logging.getLogger(__name__)

#: The HTTP status of a :class:`~serve.core.errors.ServeError` -> the gRPC status code it leaves as.
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,  # why not RESOURCE_EXHAUSTED: the module docstring
    415: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
#: What the health service answers for: the whole server (""), and each service by name.
HEALTH_SERVICES = ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService",
                   "inference.GRPCInferenceService")
#: Seconds between a ``Watch`` stream's looks at readiness (a probe runs at most once a second anyway).
WATCH_INTERVAL_S = 1.0
#: ``Watch`` streams one worker keeps open at once: each holds a server thread.
MAX_WATCHES = 4
#: Seconds ``stop`` lets the calls under way finish.
STOP_GRACE_S = 5.0


class Failure(Exception):
    """A call's end as a gRPC status code and message (for what has no HTTP status: deadlines, cancellation)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def status_code(http_status):
    """The gRPC code for an HTTP status (a 4xx without its own code is ``INVALID_ARGUMENT``, a 5xx ``INTERNAL``)."""
    return CODES.get(http_status, grpc.StatusCode.INVALID_ARGUMENT if http_status < 500 else grpc.StatusCode.INTERNAL)


def _edge(method):
    """Every call's one exit for errors: a status code and a clear message; anything unexpected logged, as ``INTERNAL``."""

    @functools.wraps(method)
    def call(self, request, context):
        try:
            alive(context)
            return method(self, request, context)
        except Failure as e:
            code, message = e.code, str(e)
        except ServeError as e:
            code, message = status_code(e.status), str(e)
            if e.retry_after is not None:
                context.set_trailing_metadata((("retry-after", str(e.retry_after)),))
        except Exception as e:  # never UNKNOWN with a traceback: log it here, answer its kind only
            log.exception("unhandled error in %s", method.__name__)
            code, message = grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}"
        context.abort(code, message)

    return call


def alive(context):
    """Raise :class:`Failure` when the caller has gone: its deadline passed, or it cancelled the call."""
    if context.is_active():
        return
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise Failure(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed before it was answered")
    raise Failure(grpc.StatusCode.CANCELLED, "the caller cancelled the call")


def requested(model_spec):
    """``(name, version, label)`` of a ``ModelSpec``: the version it names by number or by label, or neither (None)."""
    choice = model_spec.WhichOneof("version_choice")
    return (model_spec.name, model_spec.version.value if choice == "version" else None,
            model_spec.version_label if choice == "version_label" else None)


def not_found(e, name, version):
    """A :class:`NotServed` in TF Serving's own words."""
    if e.label is not None:
        return Failure(grpc.StatusCode.NOT_FOUND, f"Unrecognized servable version label: {e.label} ({e})")
    which = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
    return Failure(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: {which} ({e})")


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``tensorflow.serving.PredictionService`` over one :class:`~serve.core.service.InferenceService`."""

    def __init__(self, service, max_tensor_bytes):
        self.service = service
        #: The most bytes one input tensor may declare: what could have arrived in one message.
        self.max_tensor_bytes = max_tensor_bytes

    def _model(self, model_spec):
        """``(name, version, info)``: version, the number the spec's version or label named (None: neither)."""
        name, version, label = requested(model_spec)
        try:
            info = self.service.model(name, version, label)
        except NotServed as e:
            raise not_found(e, name, version) from None
        return name, info.version if version is not None or label is not None else None, info

    @_edge
    def Predict(self, request, context):
        name, version, info = self._model(request.model_spec)
        signature_name = request.model_spec.signature_name or SIGNATURE_PIXELS
        signature_def = info.signature_defs.get(signature_name)
        if signature_def is None:
            raise ServeError(f"Serving signature name: {signature_name!r} not found in signature def "
                             f"(this model has {sorted(info.signature_defs)})")
        wanted = list(request.output_filter)
        known = signature_def.get("outputs", {})
        for alias in wanted:
            if alias not in known:
                raise ServeError(f"output tensor alias not found in signature: {alias}. "
                                 f"Outputs expected to be in the set {{{','.join(sorted(known))}}}.")
        if len(set(wanted)) != len(wanted):
            raise ServeError(f"output_filter names an output more than once: {wanted}")
        specs = info.input_specs[signature_name]
        for proto in request.inputs.values():  # before any conversion: a refusal costs nothing
            if proto.tensor_shape.dim:
                self.service.check_count(proto.tensor_shape.dim[0].size)
        inputs = {key: self._array(key, proto, specs) for key, proto in request.inputs.items()}
        alive(context)
        answer = self.service.run(signature_name, inputs, name, version, info=info)
        alive(context)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = name
        if answer.version is not None:
            response.model_spec.version.value = answer.version
        response.model_spec.signature_name = signature_name
        for key in wanted or sorted(answer.outputs):
            if key not in answer.outputs:
                raise ServeError(f"the model did not answer output {key!r}", 500)
            response.outputs[key].CopyFrom(tensors.to_proto(np.asarray(answer.outputs[key])))
        return response

    def _array(self, key, proto, specs):
        """One input ``TensorProto`` as numpy, refused with a reason when its shape, size or dtype cannot hold."""
        shape = [d.size for d in proto.tensor_shape.dim]
        if any(size < 0 for size in shape):
            raise ServeError(f"input {key!r} has shape {shape}: a tensor's every dimension must be known")
        if proto.tensor_shape.unknown_rank:
            raise ServeError(f"input {key!r} has an unknown rank")
        count = int(np.prod(shape, dtype=np.int64)) if len(shape) < 64 else -1
        dtype = signatures.NUMPY_DTYPES.get(_dtype_name(proto.dtype))
        if dtype is None:
            raise ServeError(f"input {key!r} is a {_dtype_name(proto.dtype)} tensor, which this server does not read")
        itemsize = 1 if dtype is object else np.dtype(dtype).itemsize
        if count < 0 or count * itemsize > self.max_tensor_bytes:
            raise ServeError(f"input {key!r} declares shape {shape}, more than {self.max_tensor_bytes} bytes: "
                             "more than one message may carry (SERVE_MAX_UPLOAD_MB)", 413)
        expected = specs.get(key, (None, None))[0]
        if key in specs and expected is not None and np.dtype(expected) != np.dtype(dtype):
            raise ServeError(f"input {key!r} must be {_dtype_name_of(expected)}, got {_dtype_name(proto.dtype)}")
        if proto.tensor_content and dtype is not object and len(proto.tensor_content) != count * itemsize:
            raise ServeError(f"input {key!r}: tensor_content holds {len(proto.tensor_content)} bytes, but shape {shape} "
                             f"of {_dtype_name(proto.dtype)} takes {count * itemsize}")
        try:
            return tensors.to_array(proto)
        except ValueError as e:
            raise ServeError(f"input {key!r}: {e}") from None

    @_edge
    def Classify(self, request, context):
        name, version, info = self._model(request.model_spec)
        signature_name = request.model_spec.signature_name
        if signature_name not in ("", SIGNATURE_BYTES):
            raise ServeError(f"Classify reads encoded images, by signature {SIGNATURE_BYTES!r}; got {signature_name!r}")
        kind = request.input.WhichOneof("kind")
        if kind != "example_list":
            raise ServeError("Classify takes input.example_list: tf.Examples each holding one encoded image in its "
                             f"{INPUT_BYTES!r} feature" + ("" if kind is None else f" (not {kind})"))
        examples = request.input.example_list.examples
        self.service.check_count(len(examples))
        datas = []
        for index, example in enumerate(examples):
            feature = example.features.feature.get(INPUT_BYTES)
            values = feature.bytes_list.value if feature is not None else ()
            if len(values) != 1:
                raise ServeError(f"example {index} must hold one encoded image in its {INPUT_BYTES!r} bytes feature, "
                                 f"holds {len(values)}")
            datas.append(values[0])
        pixels = self.service.decode(datas, lambda index: f"example {index}")
        alive(context)
        answer = self.service.infer(pixels, version=version, info=info)
        alive(context)
        k = info.num_classes if info.num_classes > 0 else self.service.limits.top_k
        response = classification_pb2.ClassificationResponse()
        response.model_spec.name = name
        if answer.version is not None:
            response.model_spec.version.value = answer.version
        response.model_spec.signature_name = SIGNATURE_BYTES
        for ranked in self.service.top_k(answer, k):
            classes = response.result.classifications.add().classes
            for entry in ranked:
                classes.add(label=entry.label, score=entry.probability)
        return response

    @_edge
    def GetModelMetadata(self, request, context):
        fields = list(request.metadata_field)
        if not fields:
            raise ServeError("GetModelMetadataRequest must specify at least one metadata_field")
        for field in fields:
            if field != "signature_def":
                raise ServeError(f"Metadata field {field} is not supported")
        name, version, info = self._model(request.model_spec)
        defs = get_model_metadata_pb2.SignatureDefMap()
        json_format.ParseDict({"signature_def": dict(info.signature_defs)}, defs)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = name
        served = version if version is not None else info.version
        if served is not None:
            response.model_spec.version.value = served
        response.metadata["signature_def"].Pack(defs)
        return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """``tensorflow.serving.ModelService``: the versions this server answers for."""

    def __init__(self, service):
        self.service = service

    @_edge
    def GetModelStatus(self, request, context):
        name, version, label = requested(request.model_spec)
        if name != self.service.model_name:
            raise Failure(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {name}")
        try:
            info = self.service.model(name, version, label)
        except NotServed as e:
            if e.label is not None:
                raise not_found(e, name, version) from None
            raise Failure(grpc.StatusCode.NOT_FOUND, f"Could not find version {version} of model {name}") from None
        shown = info.version_states()  # newest first, as TF Serving
        if version is not None or label is not None:
            shown = [(info.version, "AVAILABLE")]
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, state in shown:
            entry = response.model_version_status.add()
            entry.version = int(number)
            entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
            entry.status.error_code = 0  # tensorflow.error.OK
        return response

    @_edge
    def HandleReloadConfigRequest(self, request, context):
        raise Failure(grpc.StatusCode.UNIMPLEMENTED, "this server reads its model config from SERVE_MODEL_CONFIG_FILE, "
                      "again whenever it changes; edit that file instead")


class HealthService(health_pb2_grpc.HealthServicer):
    """``grpc.health.v1.Health``: ``SERVING`` while the model answers its probe (``readiness.check()``)."""

    def __init__(self, readiness):
        self.readiness = readiness
        self._watches = threading.BoundedSemaphore(MAX_WATCHES)

    def _status(self, service):
        if service not in HEALTH_SERVICES:
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        try:
            self.readiness.check()
        except ServeError:
            return health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse.SERVING

    @_edge
    def Check(self, request, context):
        if request.service not in HEALTH_SERVICES:
            raise Failure(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}; this server knows "
                          f"{', '.join(repr(s) for s in HEALTH_SERVICES)}")
        return health_pb2.HealthCheckResponse(status=self._status(request.service))

    def Watch(self, request, context):
        if not self._watches.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"this worker keeps at most {MAX_WATCHES} Watch streams open; use Check")
        try:
            gone = threading.Event()
            context.add_callback(gone.set)
            last = None
            while context.is_active():
                status = self._status(request.service)
                if status != last:
                    yield health_pb2.HealthCheckResponse(status=status)
                    last = status
                gone.wait(WATCH_INTERVAL_S)
        except Exception:  # the stream ends cleanly; a fault is logged, never sent as a traceback
            log.exception("unhandled error in Watch")
        finally:
            self._watches.release()


def make_server(app, address, threads=16, reuse_port=True):
    """A gRPC server over ``app``'s service, keys and readiness, bound to ``address``; returns ``(server, port)``.

    ``reuse_port`` (gRPC's Linux default) lets every gunicorn worker bind the same port, the kernel
    handing each new connection to one of them. Raises ``RuntimeError`` when the address cannot be bound.
    """
    from serve.protocols.grpc_calls import RequestIds  # here: it imports this module's neighbours
    from serve.protocols.grpc_guard import Guard  # here: it imports this module (the status codes)

    settings = app.extensions["serve.settings"]
    service = app.extensions["serve.service"]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
        # The call's span (traces on), then its request id, then the guard: a refusal has both.
        interceptors=[*tracing.grpc_interceptors(app), RequestIds(app.extensions["serve.metrics"]), Guard(app)],
        options=[
            ("grpc.max_receive_message_length", settings.max_upload_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
    )
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(service, settings.max_upload_bytes), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(service), server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(app.extensions["serve.readiness"]), server)
    from serve.protocols import v2_grpc  # here: it imports this module (the error edge)

    v2_grpc.add_to_server(server, app)  # the Open Inference Protocol on the same port, guard and limits
    port = server.add_insecure_port(address)
    if not port:
        raise RuntimeError(f"could not bind gRPC to {address}")
    return server, port


def bind_address(host, port):
    """``host:port`` as gRPC takes it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _dtype_name(enum):
    try:
        return types_pb2.DataType.Name(enum)
    except ValueError:
        return f"DT_{enum}"


def _dtype_name_of(numpy_dtype):
    return next((name for name, dtype in signatures.NUMPY_DTYPES.items() if dtype is numpy_dtype), str(numpy_dtype))
