"""A stand-in for TensorFlow Serving: its REST and gRPC protocols over a real SavedModel.

The TF Serving binary cannot be installed where the tests run, so this module serves
``MODEL_BASE/N/`` SavedModels in-process, speaking the documented wire protocols
(https://www.tensorflow.org/tfx/serving/api_rest and ``tensorflow_serving.apis``)
closely enough that the project's TF Serving backends and client cannot tell the
difference: same URLs, JSON shapes, protobuf messages, status codes and messages.

Typical usage, in a test module::

    from tfserving_standin import tfserving  # noqa: F401  (imported for its fixture)

    def test_something(tfserving):
        requests.post(f"{tfserving.rest_url}/v1/models/cifar10:predict", json=...)
        grpc.insecure_channel(tfserving.grpc_target)

Tests that ``stop()`` the stand-in must ``start()`` it again: the fixture is shared
by the whole module, and it restarts on the same ports so stored URLs stay valid.

Not implemented, as the project never uses them: ``:classify``/``:regress``,
version labels, model reloading and config files.
"""

import base64
import binascii
import http.server
import json
import pathlib
import re
import socket
import sys
import threading
from concurrent import futures

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

import contract

#: TF Serving's own signature lookup falls back to this name when a request names none.
DEFAULT_SIGNATURE = contract.SIGNATURE_PIXELS
SERVE_TAG = "serve"

#: How TF Serving's HTTP server maps a canonical status code to an HTTP status.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
}


class ServingError(Exception):
    """An error as TF Serving reports it: a canonical status code and a message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self):
        return _HTTP_STATUS.get(self.code, 500)


def _invalid(message):
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


class _Version:
    """One loaded version: the restored object, its signatures, and their SignatureDefs."""

    def __init__(self, path):
        self.path = path
        self.loaded = tf.saved_model.load(str(path))
        # TF Serving reports the SignatureDefs stored in saved_model.pb, not what Python
        # rebuilds from them, so metadata is byte-for-byte what the export wrote.
        saved_model = saved_model_pb2.SavedModel()
        saved_model.ParseFromString((path / "saved_model.pb").read_bytes())
        meta_graph = next(
            (mg for mg in saved_model.meta_graphs if SERVE_TAG in mg.meta_info_def.tags), saved_model.meta_graphs[0]
        )
        self.signature_def_map = get_model_metadata_pb2.SignatureDefMap()
        for name, signature_def in meta_graph.signature_def.items():
            self.signature_def_map.signature_def[name].CopyFrom(signature_def)

    def signature(self, name):
        """The concrete function of signature ``name`` (TF Serving's default when empty)."""
        name = name or DEFAULT_SIGNATURE
        if name not in self.loaded.signatures:
            raise _invalid(f'Serving signature name: "{name}" not found in signature def')
        return name, self.loaded.signatures[name]


def _input_specs(function):
    return dict(function.structured_input_signature[1])


def _output_dtypes(function):
    return {name: spec.dtype for name, spec in function.structured_outputs.items()}


def _check_shape(alias, spec, array):
    expected = spec.shape
    if expected.rank is not None and (
        array.ndim != expected.rank or any(d is not None and d != a for d, a in zip(expected.as_list(), array.shape))
    ):
        shape = [-1 if d is None else d for d in expected.as_list()]
        raise _invalid(f"input tensor {alias} has shape {list(array.shape)}, which does not match {shape}")


def _check_aliases(given, known, message):
    """Refuse the first alias of ``given`` not in ``known`` with TF Serving's ``message`` (its words differ for
    inputs and outputs, down to a full stop)."""
    for alias in given:
        if alias not in known:
            raise _invalid(message.format(alias=alias, known=",".join(sorted(known))))


def _run(function, inputs, output_filter=()):
    """Call a signature on numpy ``inputs`` (a dict by alias); return numpy outputs by alias."""
    specs = _input_specs(function)
    _check_aliases(inputs, specs,
                   "input tensor alias not found in signature: {alias}. Inputs expected to be in the set {{{known}}}.")
    missing = sorted(set(specs) - set(inputs))
    if missing:
        raise _invalid(f"Missing input tensor alias(es): {', '.join(missing)}")
    outputs = _output_dtypes(function)
    _check_aliases(output_filter, outputs,
                   "output tensor alias not found in signature: {alias} Outputs expected to be in the set {{{known}}}.")
    tensors = {}
    for alias, array in inputs.items():
        spec = specs[alias]
        # TF Serving feeds tensors as they come and the session rejects a wrong dtype;
        # tf.constant would quietly cast float pixels to uint8 instead.
        given = tf.string if array.dtype == object or array.dtype.kind == "S" else tf.as_dtype(array.dtype)
        if given != spec.dtype:
            raise _invalid(f"input tensor {alias}: expects {spec.dtype.name} but {given.name} is provided")
        _check_shape(alias, spec, array)
        try:
            tensors[alias] = tf.constant(array, dtype=spec.dtype)
        except (TypeError, ValueError) as error:
            raise _invalid(f"input tensor {alias}: expects {spec.dtype.name}: {error}") from error
    try:
        result = function(**tensors)
    except tf.errors.InvalidArgumentError as error:
        raise _invalid(error.message) from error
    except tf.errors.OpError as error:
        raise ServingError(grpc.StatusCode.INTERNAL, error.message) from error
    wanted = list(output_filter) or sorted(result)
    return {alias: result[alias].numpy() for alias in wanted}


# ---------------------------------------------------------------------------
# JSON <-> numpy, as TF Serving's json_tensor.cc does it
# ---------------------------------------------------------------------------

_INT_RANGES = {
    dtype: (np.iinfo(dtype.as_numpy_dtype).min, np.iinfo(dtype.as_numpy_dtype).max)
    for dtype in (tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64)
}


def _is_b64(value):
    return isinstance(value, dict) and list(value) == ["b64"]


def _type_error(value, dtype):
    kind = type(value).__name__
    return _invalid(f"JSON Value: {json.dumps(value)} Type: {kind} is not of expected type: {dtype.name}")


def _leaf(value, dtype):
    if dtype == tf.string:
        if isinstance(value, str):
            return value.encode("utf-8")
        if _is_b64(value) and isinstance(value["b64"], str):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError) as error:
                raise _invalid(f"Unable to base64 decode: {json.dumps(value)}") from error
        raise _type_error(value, dtype)
    if dtype == tf.bool:
        if isinstance(value, bool):
            return value
        raise _type_error(value, dtype)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(value, dtype)
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        if not isinstance(value, int) or not low <= value <= high:
            raise _type_error(value, dtype)
    return value


def _json_to_array(value, dtype):
    def convert(v):
        return [convert(x) for x in v] if isinstance(v, list) else _leaf(v, dtype)

    nested = convert(value)
    numpy_dtype = object if dtype == tf.string else dtype.as_numpy_dtype
    try:
        return np.array(nested, dtype=numpy_dtype)
    except ValueError as error:
        raise _invalid(f"Failed to process element: {error} (lists of unequal length?)") from error


def _b64_json(data):
    return {"b64": base64.b64encode(data).decode("ascii")}


def _utf8_json(data):
    return data.decode("utf-8", "replace")


def _array_to_json(alias, array):
    if array.dtype == object or array.dtype.kind == "S":
        # TF Serving's convention: only outputs named *_bytes carry binary data.
        encode = _b64_json if alias.endswith("_bytes") else _utf8_json
        return np.vectorize(encode, otypes=[object])(array).tolist() if array.ndim else encode(array.item())
    return array.tolist()


def _parse_predict_body(body, function):
    """Return (inputs by alias, row_format) from a :predict request body."""
    specs = _input_specs(function)
    if "instances" in body and "inputs" in body:
        raise _invalid("Not both 'instances' and 'inputs' must be specified")
    if "instances" in body:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise _invalid("'instances' must be a non-empty JSON list")
        named = [isinstance(i, dict) and not _is_b64(i) for i in instances]
        if any(named) and not all(named):
            raise _invalid("Expecting all 'instances' to be JSON objects, or none of them")
        if not all(named):
            if len(specs) != 1:
                raise _invalid(f"Expecting named inputs ({', '.join(sorted(specs))}) in every instance")
            (alias,) = specs
            return {alias: _json_to_array(instances, specs[alias].dtype)}, True
        aliases = set(instances[0])
        if any(set(i) != aliases for i in instances):
            raise _invalid("Expecting all 'instances' to have the same named inputs")
        inputs = {}
        for alias in aliases:
            if alias not in specs:
                raise _invalid(f"input tensor alias not found in signature: {alias}")
            inputs[alias] = _json_to_array([i[alias] for i in instances], specs[alias].dtype)
        return inputs, True
    if "inputs" in body:
        value = body["inputs"]
        if isinstance(value, dict) and not _is_b64(value):
            inputs = {}
            for alias, v in value.items():
                if alias not in specs:
                    raise _invalid(f"input tensor alias not found in signature: {alias}")
                inputs[alias] = _json_to_array(v, specs[alias].dtype)
            return inputs, False
        if len(specs) != 1:
            raise _invalid(f"Expecting 'inputs' to be a JSON object keyed by ({', '.join(sorted(specs))})")
        (alias,) = specs
        return {alias: _json_to_array(value, specs[alias].dtype)}, False
    raise _invalid("Missing 'inputs' or 'instances' key")


def _format_predict_response(outputs, row_format):
    if not row_format:
        if len(outputs) == 1:
            ((alias, array),) = outputs.items()
            return {"outputs": _array_to_json(alias, array)}
        return {"outputs": {alias: _array_to_json(alias, array) for alias, array in outputs.items()}}
    sizes = {array.shape[0] if array.ndim else None for array in outputs.values()}
    if len(sizes) != 1 or None in sizes:
        raise _invalid("Output tensors have different or no batch sizes; use the columnar 'inputs' format")
    columns = {alias: _array_to_json(alias, array) for alias, array in outputs.items()}
    if len(columns) == 1:
        return {"predictions": next(iter(columns.values()))}
    (size,) = sizes
    return {"predictions": [{alias: column[i] for alias, column in columns.items()} for i in range(size)]}


# ---------------------------------------------------------------------------
# The stand-in
# ---------------------------------------------------------------------------


class StandIn:
    """TF Serving for one model: every numeric version under ``model_base_path``, over REST and gRPC.

    Attributes:
        rest_url: ``http://127.0.0.1:PORT``, fixed after the first ``start()``.
        grpc_target: ``127.0.0.1:PORT``, fixed after the first ``start()``.
        delay_s: seconds every Predict sleeps before answering (0 by default), so tests can
            make a backend or client time out; ``wake()`` ends the sleeps under way.
        max_batch_size: None (the default), or the most rows one Predict may carry: a bigger
            one is refused with INVALID_ARGUMENT, as TF Serving's batching refuses a task over
            its ``max_batch_size`` (``deploy/batching.config``).
        predict_calls: how many Predict calls (REST and gRPC) reached the model, so tests can
            tell a request that was forwarded from one answered elsewhere.
        batch_sizes: the rows of each Predict call that reached the model, in order.
        traceparents: the W3C ``traceparent`` each call carried (header or metadata; None without), in order,
            as ``(protocol, what, traceparent)``: ``("rest", "POST /v1/models/...", ...)``, ``("grpc", "Predict", ...)``.
    """

    def __init__(self, model_base_path, model_name=contract.DEFAULT_MODEL_NAME):
        self.model_name = model_name
        self.base_path = pathlib.Path(model_base_path)
        self.versions = {
            int(p.name): _Version(p) for p in sorted(self.base_path.iterdir()) if p.is_dir() and p.name.isdigit()
        }
        if not self.versions:
            raise FileNotFoundError(f"no numeric version directories under {self.base_path}")
        self.delay_s = 0.0
        self.max_batch_size = None
        self.predict_calls = 0
        self.batch_sizes = []
        self.traceparents = []
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._rest_port = None
        self._grpc_port = None
        self._http = None
        self._http_thread = None
        self._grpc = None
        self._connections = set()

    @property
    def rest_url(self):
        return f"http://127.0.0.1:{self._rest_port}"

    @property
    def grpc_target(self):
        return f"127.0.0.1:{self._grpc_port}"

    @property
    def running(self):
        return self._http is not None

    # -- the servable logic both protocols share ------------------------------------

    def resolve(self, name, version=None):
        """Return (version number, _Version) for a request, raising NOT_FOUND as TF Serving does."""
        if name != self.model_name:
            spec = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: {spec}")
        if version is None:
            version = max(self.versions)
        if version not in self.versions:
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Specific({name}, {version})")
        return version, self.versions[version]

    def status(self, name, version=None):
        """Versions to report for GetModelStatus, newest first (TF Serving's order)."""
        if name != self.model_name:
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {name}")
        if version is not None and version not in self.versions:
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Could not find version {version} of model {name}")
        return [version] if version is not None else sorted(self.versions, reverse=True)

    def predict(self, version, signature_name, inputs, output_filter=()):
        """Run one Predict; return (resolved signature name, outputs by alias)."""
        signature_name, function = version.signature(signature_name)
        rows = max((int(np.shape(array)[0]) for array in inputs.values() if np.ndim(array)), default=1)
        if self.max_batch_size is not None and rows > self.max_batch_size:
            # TF Serving's batch scheduler, in these words, before the model sees anything.
            raise _invalid(f"Task size {rows} is larger than maximum input batch size {self.max_batch_size}")
        with self._lock:
            self.predict_calls += 1
            self.batch_sizes.append(rows)
        if self.delay_s > 0:
            self._wake.wait(self.delay_s)
        return signature_name, _run(function, inputs, output_filter)

    def wake(self):
        """End every ``delay_s`` sleep under way (later calls sleep again while ``delay_s`` is set)."""
        wake, self._wake = self._wake, threading.Event()
        wake.set()

    # -- lifecycle -------------------------------------------------------------------

    def start(self):
        """Start REST and gRPC on 127.0.0.1: free ports the first time, the same ports after."""
        if self.running:
            return self
        self._http = _HTTPServer(("127.0.0.1", self._rest_port or 0), _handler_for(self))
        self._rest_port = self._http.server_address[1]
        self._http_thread = threading.Thread(target=self._http.serve_forever, name="tfserving-rest", daemon=True)
        self._http_thread.start()

        # SO_REUSEPORT off: with it, a second server could share the port silently and a
        # stopped stand-in would still answer through it.
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.so_reuseport", 0)])
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(_PredictionService(self), self._grpc)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelService(self), self._grpc)
        port = self._grpc.add_insecure_port(f"127.0.0.1:{self._grpc_port or 0}")
        if not port:
            self.stop()
            raise OSError(f"could not bind gRPC to 127.0.0.1:{self._grpc_port}")
        self._grpc_port = port
        self._grpc.start()
        return self

    def stop(self):
        """Stop both servers; afterwards new connections are refused and open ones are closed."""
        if self._grpc is not None:
            self._grpc.stop(grace=None).wait()
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            # Keep-alive connections outlive the listening socket; close them so a client
            # with a pooled connection sees the server go away, as it would with TF Serving.
            for connection in list(self._connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._http_thread.join(timeout=5)
            self._http = None


# ---------------------------------------------------------------------------
# REST
# ---------------------------------------------------------------------------

_MODEL_PATH = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?(?P<rest>.*)$")


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # stop() cuts open connections on purpose; only unexpected errors deserve a traceback.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def _handler_for(standin):
    class Handler(_RestHandler):
        pass

    Handler.standin = standin
    return Handler


class _RestHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "TFServingStandIn"
    standin = None

    def setup(self):
        super().setup()
        self.standin._connections.add(self.connection)

    def finish(self):
        self.standin._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format, *args):
        pass  # pytest captures stderr; per-request lines would only bury real failures

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def _dispatch(self, method):
        self.standin.traceparents.append(("rest", f"{method} {self.path}", self.headers.get("traceparent")))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            status, payload = 200, self._route(method, body)
        except ServingError as error:
            status, payload = error.http_status, {"error": error.message}
        except Exception as error:  # a stand-in must answer, as TF Serving does
            status, payload = 500, {"error": f"{type(error).__name__}: {error}"}
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method, body):
        path = self.path.split("?", 1)[0]
        match = _MODEL_PATH.match(path)
        malformed = _invalid(f"Malformed request: {method} {path}")
        if not match:
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Malformed request: {method} {path}")
        name, version, rest = match["name"], match["version"], match["rest"]
        if version is not None:
            if not version.isdigit():
                raise malformed
            version = int(version)
        if method == "GET" and rest == "":
            return self._status(name, version)
        if method == "GET" and rest == "/metadata":
            return self._metadata(name, version)
        if method == "POST" and rest == ":predict":
            return self._predict(name, version, body)
        if method == "POST" and rest in (":classify", ":regress"):
            raise ServingError(grpc.StatusCode.UNIMPLEMENTED, f"{rest[1:]} is not implemented by the stand-in")
        raise malformed

    def _status(self, name, version):
        response = _status_response(self.standin, name, version)
        return json_format.MessageToDict(
            response, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
        )

    def _metadata(self, name, version):
        number, servable = self.standin.resolve(name, version)
        signature_def = json_format.MessageToDict(
            servable.signature_def_map, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
        )
        return {
            "model_spec": {"name": name, "signature_name": "", "version": str(number)},
            "metadata": {"signature_def": signature_def},
        }

    def _predict(self, name, version, body):
        number, servable = self.standin.resolve(name, version)
        try:
            request = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _invalid(f"JSON Parse error: {error}") from error
        if not isinstance(request, dict):
            raise _invalid("JSON Value is not an object")
        signature_name = request.get("signature_name", "")
        if not isinstance(signature_name, str):
            raise _invalid("'signature_name' key must be a string")
        _, function = servable.signature(signature_name)
        inputs, row_format = _parse_predict_body(request, function)
        _, outputs = self.standin.predict(servable, signature_name, inputs)
        return _format_predict_response(outputs, row_format)


# ---------------------------------------------------------------------------
# gRPC
# ---------------------------------------------------------------------------


def _version_of(model_spec):
    return model_spec.version.value if model_spec.HasField("version") else None


def _status_response(standin, name, version):
    response = get_model_status_pb2.GetModelStatusResponse()
    for number in standin.status(name, version):
        entry = response.model_version_status.add()
        entry.version = number
        entry.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
        entry.status.error_code = 0  # tensorflow.error.OK
    return response


def _note_traceparent(standin, method, context):
    given = dict(context.invocation_metadata() or ()).get("traceparent")
    standin.traceparents.append(("grpc", method, given))


def _abort(context, error):
    context.abort(error.code, error.message)


class _PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, standin):
        self.standin = standin

    def Predict(self, request, context):
        _note_traceparent(self.standin, "Predict", context)
        try:
            number, servable = self.standin.resolve(request.model_spec.name, _version_of(request.model_spec))
            try:
                inputs = {alias: tf.make_ndarray(proto) for alias, proto in request.inputs.items()}
            except (TypeError, ValueError) as error:
                raise _invalid(f"Invalid TensorProto: {error}") from error
            signature_name, outputs = self.standin.predict(
                servable, request.model_spec.signature_name, inputs, list(request.output_filter)
            )
        except ServingError as error:
            _abort(context, error)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = number
        response.model_spec.signature_name = signature_name
        for alias, array in outputs.items():
            response.outputs[alias].CopyFrom(tf.make_tensor_proto(array))
        return response

    def GetModelMetadata(self, request, context):
        _note_traceparent(self.standin, "GetModelMetadata", context)
        try:
            fields = list(request.metadata_field)
            if not fields:
                raise _invalid("GetModelMetadataRequest must specify at least one metadata_field")
            for field in fields:
                if field != "signature_def":
                    raise _invalid(f"Metadata field {field} is not supported")
            number, servable = self.standin.resolve(request.model_spec.name, _version_of(request.model_spec))
        except ServingError as error:
            _abort(context, error)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = number
        response.metadata["signature_def"].Pack(servable.signature_def_map)
        return response

    def Classify(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Classify is not implemented by the stand-in")

    def Regress(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Regress is not implemented by the stand-in")

    def MultiInference(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "MultiInference is not implemented by the stand-in")


class _ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, standin):
        self.standin = standin

    def GetModelStatus(self, request, context):
        try:
            return _status_response(self.standin, request.model_spec.name, _version_of(request.model_spec))
        except ServingError as error:
            _abort(context, error)


@pytest.fixture(scope="module")
def tfserving(model_base):
    """A started :class:`StandIn` serving ``model_base`` as ``cifar10``; stopped after the module."""
    standin = StandIn(model_base).start()
    yield standin
    standin.stop()
