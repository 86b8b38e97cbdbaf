"""The Open Inference Protocol's inference request: its JSON header and binary tail, the one input
tensor it carries (pixels, or encoded images for the serving core to decode), and the outputs it asks for."""

import base64
import binascii
import struct
import zlib

import numpy as np
from flask import current_app, request

from contract import CHANNELS, IMAGE_SIZE, INPUT_BYTES, INPUT_PIXELS, OUTPUTS, OUTPUT_PROBABILITIES
from serve import json_tensors
from serve.core import ServeError
from serve.protocols import service, settings

#: The binary tensor data extension's header: how many leading body bytes are the JSON.
HEADER_LENGTH = "Inference-Header-Content-Length"
INPUTS = {
    INPUT_PIXELS: ("UINT8", [-1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS]),
    INPUT_BYTES: ("BYTES", [-1]),
}


def read_body():
    """``(JSON header, binary tail)``: the whole body is JSON unless ``Inference-Header-Content-Length`` splits it."""
    body = _decompressed(request.get_data(cache=False), request.headers.get("Content-Encoding"))
    header_length = request.headers.get(HEADER_LENGTH)
    if header_length is None:
        header, tail = body, b""
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise ServeError(f"{HEADER_LENGTH} must be a whole number, got {header_length!r}") from None
        if not 0 < length <= len(body):
            raise ServeError(f"{HEADER_LENGTH} is {length}, but the body has {len(body)} bytes")
        header, tail = body[:length], memoryview(body)[length:]
    try:
        # The app's provider (deep nesting is a ValueError too), with the pixels straight into NumPy.
        payload = json_tensors.loads(bytes(header), "data", current_app.json.loads)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ServeError(f"the inference request is not valid JSON ({e or type(e).__name__})") from None
    if not isinstance(payload, dict):
        raise ServeError("the inference request must be a JSON object")
    return payload, tail


def _decompressed(body, encoding):
    """``body`` inflated as ``Content-Encoding`` says, never to more than the upload limit."""
    if encoding in (None, "", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ServeError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate or none)", 415)
    limit = settings().max_upload_bytes
    inflater = zlib.decompressobj(31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, limit + 1 if limit else 0)
    except zlib.error:
        raise ServeError(f"the body is not valid {encoding} data") from None
    if limit and (len(data) > limit or inflater.unconsumed_tail):
        raise ServeError(f"the request is larger than the {limit / 1048576:g} MiB limit once inflated", 413)
    return data


class Binary:
    """The binary tail of a request, handed out to the inputs in order."""

    def __init__(self, data):
        self.data, self.offset = data, 0

    def take(self, name, size):
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ServeError(f"input {name!r}: binary_data_size must be a non-negative whole number, got {size!r}")
        if self.offset + size > len(self.data):
            raise ServeError(f"input {name!r} declares {size} bytes of binary data, but only {len(self.data) - self.offset} are left")
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def check_consumed(self):
        if self.offset != len(self.data):
            raise ServeError(f"{len(self.data) - self.offset} bytes after the JSON header belong to no input")


def _takes():
    return " or ".join(f"{key!r} ({datatype} {shape})" for key, (datatype, shape) in INPUTS.items())


def read_input(payload, binary):
    """uint8 pixels ``[N, 32, 32, 3]`` from the request's one input tensor (encoded images decoded by the core)."""
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ServeError('"inputs" must be a non-empty list of tensors')
    tensors = {}
    for tensor in inputs:
        if not isinstance(tensor, dict):
            raise ServeError("each input must be an object with name, shape, datatype and data")
        key = tensor.get("name")
        if not isinstance(key, str) or key not in INPUTS:
            raise ServeError(f"unknown input {key!r}; this model takes {_takes()}")
        if key in tensors:
            raise ServeError(f"input {key!r} is given twice")
        tensors[key] = _read_tensor(key, tensor, binary)
    binary.check_consumed()
    if len(tensors) != 1:
        raise ServeError(f"send one input, not {len(tensors)}: {_takes()}")
    ((key, values),) = tensors.items()
    return values if key == INPUT_PIXELS else _decode(key, values)


def _read_tensor(key, tensor, binary):
    want_datatype, want_shape = INPUTS[key]
    datatype, shape = tensor.get("datatype"), tensor.get("shape")
    if datatype != want_datatype:
        raise ServeError(f"input {key!r} must have datatype {want_datatype}, got {datatype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ServeError(f"input {key!r}: shape must be a list of non-negative whole numbers, got {shape!r}")
    if len(shape) != len(want_shape) or any(w not in (-1, d) for w, d in zip(want_shape, shape)):
        raise ServeError(f"input {key!r} must have shape {want_shape}, got {shape}")
    if shape[0] == 0:
        raise ServeError(f"input {key!r} holds no images (shape {shape})")
    service().check_count(shape[0])
    parameters = _parameters(f"input {key!r}", tensor)
    count = int(np.prod(shape))
    if "binary_data_size" in parameters:
        if "data" in tensor:
            raise ServeError(f"input {key!r} has both data and binary_data_size")
        raw = binary.take(key, parameters["binary_data_size"])
        if datatype == "BYTES":
            return np.array(_unpack_bytes(key, raw, count), dtype=object)
        if len(raw) != count:
            raise ServeError(f"input {key!r} has {len(raw)} bytes of binary data; shape {shape} needs {count}")
        return np.frombuffer(raw, np.uint8).reshape(shape)
    if "data" not in tensor:
        raise ServeError(f"input {key!r} has no data (nor binary_data_size)")
    if datatype == "BYTES":
        return np.array(_json_bytes(key, tensor["data"], count, parameters.get("content_type")), dtype=object)
    return _json_pixels(key, tensor["data"], shape, count)


def _parameters(what, tensor):
    """A tensor's ``parameters`` (``{}`` when absent); the shared-memory extension is refused."""
    parameters = tensor.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ServeError(f"{what}: parameters must be an object")
    if "shared_memory_region" in parameters:
        raise ServeError("this server does not implement the shared-memory extension; send the data in the request")
    return parameters


def _json_pixels(key, data, shape, count):
    if not isinstance(data, (list, np.ndarray)):  # an array when serve.json_tensors read it
        raise ServeError(f"input {key!r}: data must be a list of numbers")
    try:
        array = np.asarray(data)
    except ValueError:
        raise ServeError(f"input {key!r}: data is not a tensor (ragged, or nested too deeply)") from None
    if array.size != count:
        raise ServeError(f"input {key!r} has {array.size} values; shape {shape} needs {count}")
    if array.dtype.kind not in "iu":
        raise ServeError(f"input {key!r}: UINT8 data must be whole numbers 0..255")
    if array.min() < 0 or array.max() > 255:
        raise ServeError(f"input {key!r} has values outside the UINT8 range 0..255")
    return array.astype(np.uint8).reshape(shape)


def _json_bytes(key, data, count, content_type):
    """BYTES elements given in JSON: strings, as UTF-8, or base64 under ``content_type: base64`` (MLServer's codec)."""
    if not isinstance(data, list) or not all(isinstance(value, str) for value in data):
        raise ServeError(f"input {key!r}: BYTES data must be a list of strings")
    if len(data) != count:
        raise ServeError(f"input {key!r} has {len(data)} elements; its shape needs {count}")
    if content_type == "base64":
        try:
            return [base64.b64decode(value, validate=True) for value in data]
        except (binascii.Error, ValueError):
            raise ServeError(f"input {key!r}: an element is not valid base64") from None
    if content_type not in (None, "str"):
        raise ServeError(f"input {key!r}: content_type {content_type!r} is not supported (base64, or none for UTF-8 text)")
    try:
        return [value.encode("utf-8") for value in data]
    except UnicodeEncodeError:  # a lone surrogate such as "\ud800", which JSON can spell and UTF-8 cannot
        raise ServeError(f"input {key!r}: an element is not valid Unicode text (a lone surrogate)") from None


def _unpack_bytes(key, raw, count):
    """The binary form of a BYTES tensor: each element a little-endian uint32 length, then its bytes."""
    elements, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise ServeError(f"input {key!r}: the binary data ends inside an element's length")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise ServeError(f"input {key!r}: element {len(elements)} declares {size} bytes, but only {len(raw) - offset} are left")
        elements.append(bytes(raw[offset : offset + size]))
        offset += size
    if len(elements) != count:
        raise ServeError(f"input {key!r} has {len(elements)} elements of binary data; its shape needs {count}")
    return elements


def _decode(key, datas):
    """Encoded images to pixels with the decoder ``/api/v1/predict`` uses; the first bad one fails the request."""
    return service().decode(list(datas), lambda index: f"input {key!r} element {index}")


def requested_outputs(payload, available=OUTPUTS):
    """``[(output name, parameters)]``: the ``outputs`` asked for, or all of ``available``."""
    parameters = payload.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ServeError("parameters must be an object")
    binary = parameters.get("binary_data_output", False)
    if not isinstance(binary, bool):
        raise ServeError("binary_data_output must be true or false")
    requested = payload.get("outputs")
    if not requested:  # absent or empty: every output
        return [(key, {"binary_data": binary}) for key in available]
    if not isinstance(requested, list):
        raise ServeError('"outputs" must be a list of objects such as {"name": "probabilities"}')
    wanted = []
    for output in requested:
        key = output.get("name") if isinstance(output, dict) else None
        if key not in available:
            raise ServeError(f"unknown output {key!r}; this model has {', '.join(available)}")
        options = _parameters(f"output {key!r}", output)
        options = {"binary_data": options.get("binary_data", binary), "classification": options.get("classification", 0)}
        if not isinstance(options["binary_data"], bool):
            raise ServeError(f"output {key!r}: binary_data must be true or false")
        k = options["classification"]
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ServeError(f"output {key!r}: classification must be a whole number of classes, got {k!r}")
        if k and key != OUTPUT_PROBABILITIES:
            raise ServeError(f"classification applies to {OUTPUT_PROBABILITIES!r}, not {key!r}")
        wanted.append((key, options))
    return wanted
