"""``/v1/models/...``: TF Serving's REST API, so existing TF Serving clients work unchanged.

Predict takes the row (``instances``) or columnar (``inputs``) format, an optional
``signature_name`` and ``{"b64": ...}`` for string tensors; it answers ``predictions`` or
``outputs`` shaped as TF Serving shapes them. Status and metadata follow TF Serving too.

``predict_images`` is answered by the serving core (:meth:`serve.core.service.InferenceService.run`:
its decoder, then the model's ``serving_default``), on every runtime and backend: the same image
gets the same class here as on ``/api/v1/predict``, and no user bytes reach a model or a TF Serving.
"""

import base64
import binascii

import numpy as np
from flask import Blueprint, jsonify
from werkzeug.routing import BaseConverter

from contract import SIGNATURE_PIXELS, TFSERVING_REST_PREFIX
from serve import bodies
from serve.core import NotServed, ServeError, float32_list
from serve.protocols import json_error, service

bp = Blueprint("tfserving", __name__, url_prefix=TFSERVING_REST_PREFIX)

#: Most dimensions a string input may have: numpy's limit, which numeric inputs meet in np.asarray.
MAX_RANK = 64


class ModelNameConverter(BaseConverter):
    """A model name stops at ``/`` and at ``:`` (``/v1/models/cifar10:predict``)."""

    regex = r"[^/:]+"


@bp.record_once
def _register_converter(state):
    state.app.url_map.converters["model"] = ModelNameConverter


@bp.errorhandler(ServeError)
def _error(e):
    if isinstance(e, NotServed):  # TF Serving's own words
        if e.label is not None:
            return jsonify(error=f"Unrecognized servable version label: {e.label}"), 404
        which = f"Specific({e.name}, {e.version})" if e.version is not None else f"Latest({e.name})"
        return jsonify(error=f"Servable not found for request: {which}"), 404
    return json_error(e)


@bp.get("/<model:name>")
@bp.get("/<model:name>/versions/<int:version>")
@bp.get("/<model:name>/labels/<model:label>")
def status(name, version=None, label=None):
    """Every version the server knows, newest first, with its state (one, when a version or label is named)."""
    info = service().model(name, version, label)
    shown = info.version_states()
    if version is not None or label is not None:
        shown = [(info.version, "AVAILABLE")]
    return jsonify(
        model_version_status=[
            {"version": str(v), "state": state, "status": {"error_code": "OK", "error_message": ""}} for v, state in shown
        ]
    )


@bp.get("/<model:name>/metadata")
@bp.get("/<model:name>/versions/<int:version>/metadata")
@bp.get("/<model:name>/labels/<model:label>/metadata")
def metadata(name, version=None, label=None):
    info = service().model(name, version, label)
    return jsonify(
        model_spec={"name": name, "signature_name": "", "version": str(info.version)},
        metadata={"signature_def": {"signature_def": dict(info.signature_defs)}},
    )


@bp.post("/<model:name>:predict")
@bp.post("/<model:name>/versions/<int:version>:predict")
@bp.post("/<model:name>/labels/<model:label>:predict")
def predict(name, version=None, label=None):
    info = service().model(name, version, label)
    body = bodies.request_json(tensor=("instances", "inputs"))  # a batch of pixels straight into NumPy
    if not isinstance(body, dict):
        raise ServeError("the body must be a JSON object")
    signature_name = body.get("signature_name") or SIGNATURE_PIXELS
    if not isinstance(signature_name, str):
        raise ServeError("signature_name must be a string")
    specs = info.input_specs.get(signature_name)
    if specs is None:
        raise ServeError(f"Serving signature name: {signature_name!r} not found in signature def")
    row_format = "instances" in body
    if row_format == ("inputs" in body):
        raise ServeError('send exactly one of "instances" (row format) or "inputs" (columnar format)')
    inputs = _parse_inputs(body["instances"] if row_format else body["inputs"], row_format, specs)
    answer = service().run(signature_name, inputs, name, version, label, info=info)
    outputs = {key: _jsonable(key, np.asarray(value)) for key, value in answer.outputs.items()}
    if row_format:
        return jsonify(predictions=_rows(outputs))
    return jsonify(outputs=outputs if len(outputs) > 1 else next(iter(outputs.values())))


def _is_b64(value):
    return isinstance(value, dict) and set(value) == {"b64"}


def _parse_inputs(value, row_format, specs):
    if row_format:
        if isinstance(value, np.ndarray) and len(specs) == 1:  # read by serve.json_tensors: rows of integers
            columns = {next(iter(specs)): value}
        elif not isinstance(value, list) or not value:
            raise ServeError('"instances" must be a non-empty list')
        elif all(isinstance(row, dict) and not _is_b64(row) for row in value):
            columns = {}
            for key in specs:
                if any(key not in row for row in value):
                    raise ServeError(f"every instance must have input {key!r}")
                columns[key] = [row[key] for row in value]
            extra = {k for row in value for k in row} - set(specs)
            if extra:
                raise ServeError(f"unknown inputs {sorted(extra)}; the signature takes {sorted(specs)}")
        elif len(specs) == 1:
            columns = {next(iter(specs)): value}
        else:
            raise ServeError(f"the signature takes several inputs {sorted(specs)}: give each instance as an object")
    elif isinstance(value, dict) and not _is_b64(value):
        columns = value
        if set(columns) != set(specs):
            raise ServeError(f"the signature takes inputs {sorted(specs)}, got {sorted(columns)}")
    elif len(specs) == 1:
        columns = {next(iter(specs)): value}
    else:
        raise ServeError(f"the signature takes several inputs {sorted(specs)}: give \"inputs\" as an object")
    for key in specs:  # before any conversion: a 413 costs nothing
        if isinstance(columns[key], (list, np.ndarray)):
            service().check_count(len(columns[key]))
    return {key: _to_array(key, columns[key], specs[key][0]) for key in specs}


def _to_array(key, value, dtype):
    if dtype is object:
        try:
            array = np.array(_strings(value), dtype=object)
        except ValueError as e:
            raise ServeError(f"input {key!r}: {e}") from None
        return array
    try:
        array = np.asarray(value)
    except ValueError:
        raise ServeError(f"input {key!r} is ragged or not a tensor of numbers") from None
    target = np.dtype(dtype or np.float32)
    if array.size == 0:
        return array.astype(target)
    kind = array.dtype.kind
    if target.kind in "iu":
        if kind not in "iu":
            raise ServeError(f"input {key!r} must hold integers ({target.name}), got {_kind_name(kind)}")
        info = np.iinfo(target)
        if array.min() < info.min or array.max() > info.max:
            raise ServeError(f"input {key!r} has values outside the {target.name} range {info.min}..{info.max}")
    elif target.kind == "f" and kind not in "iuf":
        raise ServeError(f"input {key!r} must hold numbers ({target.name}), got {_kind_name(kind)}")
    elif target.kind == "b" and kind != "b":
        raise ServeError(f"input {key!r} must hold booleans, got {_kind_name(kind)}")
    return array.astype(target, copy=False)


def _kind_name(kind):
    return {"f": "floats", "U": "strings", "O": "mixed values", "b": "booleans", "i": "integers", "u": "integers"}.get(
        kind, "other values"
    )


def _strings(value, depth=0):
    if isinstance(value, list):
        # Refuse deeper lists before they exhaust Python's recursion limit (a 500): the JSON
        # decoder allows nearly a thousand levels.
        if depth >= MAX_RANK:
            raise ValueError(f"the lists nest deeper than {MAX_RANK} levels")
        return [_strings(v, depth + 1) for v in value]
    if _is_b64(value):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise ValueError("a b64 value is not valid base64") from None
    if isinstance(value, str):
        return value.encode()
    raise ValueError(f"string inputs take strings or {{\"b64\": ...}}, got {type(value).__name__}")


def _jsonable(key, array):
    """One output as TF Serving writes it: strings as text, or ``{"b64"}`` when the key ends in ``_bytes``."""
    if array.dtype == object or array.dtype.kind in "SU":
        if key.endswith("_bytes"):
            leaf = lambda v: {"b64": base64.b64encode(v if isinstance(v, bytes) else str(v).encode()).decode()}  # noqa: E731
        else:
            leaf = lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)  # noqa: E731
        return _map(array.tolist(), leaf)
    if array.dtype == np.float32:
        return float32_list(array)
    return array.tolist()


def _map(value, fn):
    return [_map(v, fn) for v in value] if isinstance(value, list) else fn(value)


def _rows(outputs):
    """Row format: one entry per example; a dict of outputs, or the bare value for a single output."""
    lengths = {len(v) if isinstance(v, list) else -1 for v in outputs.values()}
    if len(lengths) != 1 or -1 in lengths:
        raise ServeError("the outputs have different batch sizes; ask for the columnar format (\"inputs\")")
    (n,) = lengths
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    return [{key: value[i] for key, value in outputs.items()} for i in range(n)]
