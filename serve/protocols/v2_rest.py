"""``/v2``: the Open Inference Protocol (KServe v2) over HTTP, so that clients written for Triton, KServe,
Seldon MLServer or OpenVINO Model Server work against this server unchanged.

The body is JSON, or JSON and a binary tail (the binary tensor data extension: ``Inference-Header-Content-Length``
says how many leading bytes are JSON; each tensor with a ``binary_data_size`` takes that many bytes of the
tail, in order), gzip- or deflate-encoded or not. Each input becomes a :class:`~serve.core.request.Tensor`
(its JSON ``data``, nested or flat, read straight into NumPy by :mod:`serve.http.json_tensors`; or its
packed bytes), checked by the core. What is shared with gRPC is in :mod:`serve.protocols.v2`.
"""

import base64
import binascii
import zlib

from flask import Blueprint, Response, current_app, jsonify, request

from contract import V2_PREFIX
from serve.core.errors import BadRequest, ServeError, TooLarge, Unsupported, echo
from serve.http import json_tensors
from serve.protocols import http_request, service, settings, v2

bp = Blueprint("v2", __name__, url_prefix=V2_PREFIX)

#: The binary tensor data extension's header: how many leading body bytes are the JSON.
HEADER_LENGTH = "Inference-Header-Content-Length"
_HEADER_LENGTH_ENVIRON = "HTTP_" + HEADER_LENGTH.upper().replace("-", "_")
EXTENSIONS = ("binary_tensor_data", "classification")


@bp.get("")
def server_metadata():
    return jsonify(name=v2.SERVER_NAME, version=v2.server_version(), extensions=list(EXTENSIONS))


@bp.get("/health/live")
def live():
    return Response(status=200)


@bp.get("/health/ready")
def ready():
    service().ready()  # the core's probe: at most one model call a second
    return Response(status=200)


@bp.get("/models/<name>/ready")
@bp.get("/models/<name>/versions/<version>/ready")
def model_ready(name, version=None):
    service().model(name, version)
    service().ready()
    return Response(status=200)


@bp.get("/models/<name>")
@bp.get("/models/<name>/versions/<version>")
def model_metadata(name, version=None):
    return jsonify(v2.metadata(name, service().model(name, version)))


@bp.post("/models/<name>/infer")
@bp.post("/models/<name>/versions/<version>/infer")
def infer(name, version=None):
    try:
        payload, tail = _read_body()
        inputs, wanted, binary = decode(payload, tail)
    except ServeError:
        service().model(name, version)  # a model or version it does not serve is a 404, whatever the body
        raise
    answer = service().infer(http_request(inputs, model_name=name, version=version, signature=v2.signature_of(inputs),
                                          outputs=v2.names(wanted), dtype_names=v2.NAMES))
    echoed = {"id": payload["id"]} if "id" in payload else {}
    header, blobs = encode(answer, wanted or v2.every_output(answer, binary), name, echoed)
    if not blobs:
        return jsonify(header)
    header = current_app.json.dumps(header).encode()
    return Response(b"".join([header, *blobs]), mimetype="application/octet-stream", headers={HEADER_LENGTH: str(len(header))})


def decode(payload, tail=b""):
    """``({name: Tensor}, [Wanted], binary by default)`` of an inference request: its JSON and its binary tail."""
    inputs = _inputs(payload, tail)
    binary = v2.check_parameters("the request", payload.get("parameters") or {}).get("binary_data_output", False)
    if not isinstance(binary, bool):
        raise BadRequest("binary_data_output must be true or false")
    return inputs, v2.wanted_outputs(_requested(payload), binary), binary


def encode(answer, wanted, name, echoed=None):
    """``(JSON header, [binary tails])`` of an inference answer: each output asked for, as JSON data or binary data;
    ``echoed``: the request's fields the answer repeats (its ``id``)."""
    header = {"model_name": name, "model_version": str(answer.version), "outputs": [], **(echoed or {})}
    blobs = []
    for want, (output, datatype, array) in zip(wanted, v2.answer_tensors(answer, wanted)):
        entry = {"name": output, "datatype": datatype, "shape": list(array.shape)}
        if want.binary:
            blob = v2.to_binary(datatype, array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = v2.to_json(datatype, array)
        header["outputs"].append(entry)
    return header, blobs


def _read_body():
    """``(JSON header, binary tail)``: the whole body is JSON unless ``Inference-Header-Content-Length`` splits it."""
    environ = request.environ
    body = _decompressed(request.get_data(cache=False), environ.get("HTTP_CONTENT_ENCODING"))
    header_length = environ.get(_HEADER_LENGTH_ENVIRON)
    if header_length is None:
        header, tail = body, b""
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise BadRequest(f"{HEADER_LENGTH} must be a whole number, got {echo(header_length)}") from None
        if not 0 < length <= len(body):
            raise BadRequest(f"{HEADER_LENGTH} is {length}, but the body has {len(body)} bytes")
        header, tail = body[:length], memoryview(body)[length:]
    try:
        # The app's provider (deep nesting is a ValueError too), with the pixels straight into NumPy.
        payload = json_tensors.loads(bytes(header), "data", current_app.json.loads)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise BadRequest(f"the inference request is not valid JSON ({e or type(e).__name__})") from None
    if not isinstance(payload, dict):
        raise BadRequest("the inference request must be a JSON object")
    return payload, tail


def _decompressed(body, encoding):
    """``body`` inflated as ``Content-Encoding`` says, never to more than the upload limit."""
    if encoding in (None, "", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise Unsupported(f"Content-Encoding {echo(encoding)} is not supported (gzip, deflate or none)")
    limit = settings().max_upload_bytes
    inflater = zlib.decompressobj(31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, limit + 1 if limit else 0)
    except zlib.error:
        raise BadRequest(f"the body is not valid {encoding} data") from None
    if limit and (len(data) > limit or inflater.unconsumed_tail):
        raise TooLarge(f"the request is larger than the {limit / 1048576:g} MiB limit once inflated")
    return data


def _inputs(payload, tail):
    """``{name: Tensor}`` of the request's inputs, each with its data or its share of the binary tail, in order."""
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest('"inputs" must be a non-empty list of tensors')
    tensors, offset = {}, 0
    for given in inputs:
        if not isinstance(given, dict):
            raise BadRequest("each input must be an object with name, shape, datatype and data")
        name = given.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"an input's name must be a string, got {echo(name)}")
        if name in tensors:
            raise BadRequest(f"input {echo(name)} is given twice")
        parameters = v2.check_parameters(f"input {echo(name)}", given.get("parameters") or {})
        datatype, shape = given.get("datatype"), given.get("shape")
        if "binary_data_size" in parameters:
            if "data" in given:
                raise BadRequest(f"input {echo(name)} has both data and binary_data_size")
            size = parameters["binary_data_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise BadRequest(f"input {echo(name)}: binary_data_size must be a non-negative whole number, got {echo(size)}")
            if offset + size > len(tail):
                raise BadRequest(f"input {echo(name)} declares {size} bytes of binary data, but only {len(tail) - offset} are left")
            tensors[name] = v2.tensor(name, datatype, shape, tail[offset : offset + size], packed=True)
            offset += size
        elif "data" in given:
            data = given["data"]
            if datatype == "BYTES":
                data = _text_or_base64(name, data, parameters.get("content_type"))
            tensors[name] = v2.tensor(name, datatype, shape, data)
        else:
            raise BadRequest(f"input {echo(name)} has no data (nor binary_data_size)")
    if offset != len(tail):
        raise BadRequest(f"{len(tail) - offset} bytes after the JSON header belong to no input")
    return tensors


def _text_or_base64(name, data, content_type):
    """BYTES elements given in JSON: strings, as UTF-8, or base64 under ``content_type: base64`` (MLServer's codec)."""
    if content_type not in (None, "str", "base64"):
        raise BadRequest(f"input {echo(name)}: content_type {echo(content_type)} is not supported (base64, or none for UTF-8 text)")
    if content_type != "base64" or not isinstance(data, list):
        return data  # the core reads strings as UTF-8, and refuses what is not a string
    try:
        return [base64.b64decode(value, validate=True) if isinstance(value, str) else value for value in data]
    except (binascii.Error, ValueError):
        raise BadRequest(f"input {echo(name)}: an element is not valid base64") from None


def _requested(payload):
    """``[(name, parameters)]`` of the outputs the request names (``[]``: none, so every output)."""
    requested = payload.get("outputs")
    if not requested:
        return []
    if not isinstance(requested, list):
        raise BadRequest('"outputs" must be a list of objects such as {"name": "probabilities"}')
    named = []
    for output in requested:
        name = output.get("name") if isinstance(output, dict) else None
        if not isinstance(name, str):
            raise BadRequest(f"an output's name must be a string, got {echo(name)}")
        named.append((name, v2.check_parameters(f"output {echo(name)}", output.get("parameters") or {})))
    return named

