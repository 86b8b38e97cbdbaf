"""``/v1/models/...``: TF Serving's REST API, so existing TF Serving clients work unchanged.

Predict takes the row (``instances``) or columnar (``inputs``) format, an optional ``signature_name`` and
``{"b64": ...}`` for string tensors, and answers ``predictions`` or ``outputs`` shaped as TF Serving shapes
them; status and metadata follow TF Serving too. A JSON value becomes a :class:`~serve.core.request.Tensor`
as it nests (its array of pixels read straight into NumPy by :mod:`serve.http.json_tensors`); the core
checks it. ``predict_images`` is answered by the core's decoder and the model's ``serving_default``, on every
runtime and backend, so the same image gets the same class here as on ``/api/v1/predict``.
"""

import base64
import binascii

import numpy as np
from flask import Blueprint, jsonify, request
from werkzeug.routing import BaseConverter

from contract import SIGNATURE_PIXELS, TFSERVING_REST_PREFIX
from serve.core.errors import BadRequest, NotServed, ServeError
from serve.core.request import Tensor
from serve.http import bodies
from serve.protocols import http_request, service, tfserving

bp = Blueprint("tfserving", __name__, url_prefix=TFSERVING_REST_PREFIX)

#: Most levels of lists searched for ``{"b64": ...}`` values (numpy's own limit on dimensions).
MAX_RANK = 64


class ModelNameConverter(BaseConverter):
    """A model name stops at ``/`` and at ``:`` (``/v1/models/cifar10:predict``)."""

    regex = r"[^/:]+"


@bp.record_once
def _register_converter(state):
    state.app.url_map.converters["model"] = ModelNameConverter


@bp.errorhandler(NotServed)
def _not_served(e):
    return jsonify(error=tfserving.not_found(e)), 404


@bp.get("/<model:name>")
@bp.get("/<model:name>/versions/<int:version>")
@bp.get("/<model:name>/labels/<model:label>")
def status(name, version=None, label=None):
    """Every version the server knows, newest first, with its state (one, when a version or label is named)."""
    info = service().model(name, version, label)
    shown = tfserving.states(info, version is not None or label is not None)
    return jsonify(model_version_status=[{"version": str(v), "state": state, "status": tfserving.OK_STATUS}
                                         for v, state in shown])


@bp.get("/<model:name>/metadata")
@bp.get("/<model:name>/versions/<int:version>/metadata")
@bp.get("/<model:name>/labels/<model:label>/metadata")
def metadata(name, version=None, label=None):
    info = service().model(name, version, label)
    return jsonify(model_spec={"name": name, "signature_name": "", "version": str(info.version)},
                   metadata={"signature_def": tfserving.metadata(info)})


@bp.post("/<model:name>:predict")
@bp.post("/<model:name>/versions/<int:version>:predict")
@bp.post("/<model:name>/labels/<model:label>:predict")
def predict(name, version=None, label=None):
    try:
        body = bodies.request_json(tensor=("instances", "inputs"))  # a batch of pixels straight into NumPy
        rows, signature, inputs = decode(body, b64=b'"b64"' in request.get_data(cache=True))
    except ServeError:
        service().model(name, version, label)  # a model, version or label it does not serve is a 404, whatever the body
        raise
    answer = service().infer(http_request(inputs, model_name=name, version=version, label=label, signature=signature))
    return jsonify(encode(answer.outputs, rows))


def decode(body, b64=True):
    """``(row format, signature name, {input key: Tensor})`` of a predict body, parsed (key None: the signature's one
    input, unnamed). ``b64``: whether ``{"b64": ...}`` values may be in it (False: none were in its text)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    signature = body.get("signature_name") or SIGNATURE_PIXELS
    if not isinstance(signature, str):
        raise BadRequest("signature_name must be a string")
    rows = "instances" in body
    if rows == ("inputs" in body):
        raise BadRequest('send exactly one of "instances" (row format) or "inputs" (columnar format)')
    named = _named(body["instances"] if rows else body["inputs"], rows)
    if named is None:  # one tensor, unnamed: the signature's one input, as TF Serving reads it
        named = {None: body["instances"] if rows else body["inputs"]}
    return rows, signature, {key: Tensor(_bytes_of(value) if b64 else value) for key, value in named.items()}


def encode(outputs, rows):
    """A predict answer's body: ``{"predictions": [...]}`` a row each, or ``{"outputs": ...}`` by output."""
    outputs = {key: _jsonable(key, np.asarray(value)) for key, value in outputs.items()}
    if rows:
        return {"predictions": _rows(outputs)}
    return {"outputs": outputs if len(outputs) > 1 else next(iter(outputs.values()))}


def _is_b64(value):
    return isinstance(value, dict) and set(value) == {"b64"}


def _named(value, rows):
    """``{input key: value}`` when the body names its inputs, else None (one tensor, unnamed)."""
    if rows:
        if not isinstance(value, (list, np.ndarray)) or not len(value):
            raise BadRequest('"instances" must be a non-empty list')
        if isinstance(value, np.ndarray) or not all(isinstance(row, dict) and not _is_b64(row) for row in value):
            return None
        keys = sorted({key for row in value for key in row})
        if any(len(row) != len(keys) for row in value):
            raise BadRequest(f"every instance must have the same inputs; they name {keys}")
        return {key: [row[key] for row in value] for key in keys}
    if isinstance(value, dict) and not _is_b64(value):
        return value
    return None


def _bytes_of(value, depth=0):
    """``value`` with every ``{"b64": ...}`` in it decoded to ``bytes`` (TF Serving's JSON for binary strings)."""
    if isinstance(value, list):
        if depth >= MAX_RANK:  # deeper lists than any tensor: not one (and never Python's recursion limit, a 500)
            raise BadRequest(f"the lists nest deeper than {MAX_RANK} levels")
        return [_bytes_of(v, depth + 1) for v in value]
    if _is_b64(value):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise BadRequest("a b64 value is not valid base64") from None
    return value


def _jsonable(key, array):
    """One output as TF Serving writes it: strings as text, or ``{"b64"}`` when the key ends in ``_bytes``; numbers as
    the array itself, which the JSON provider writes (a float32 as its shortest decimal)."""
    if array.dtype == object or array.dtype.kind in "SU":
        if key.endswith("_bytes"):
            leaf = lambda v: {"b64": base64.b64encode(v if isinstance(v, bytes) else str(v).encode()).decode()}  # noqa: E731
        else:
            leaf = lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)  # noqa: E731
        return _map(array.tolist(), leaf)
    return array


def _map(value, fn):
    return [_map(v, fn) for v in value] if isinstance(value, list) else fn(value)


def _rows(outputs):
    """Row format: one entry per example; a dict of outputs, or the bare value for a single output."""
    lengths = {len(v) if isinstance(v, list) or getattr(v, "ndim", 0) else -1 for v in outputs.values()}
    if len(lengths) != 1 or -1 in lengths:
        raise BadRequest("the outputs have different batch sizes; ask for the columnar format (\"inputs\")")
    (n,) = lengths
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    return [{key: value[i] for key, value in outputs.items()} for i in range(n)]

