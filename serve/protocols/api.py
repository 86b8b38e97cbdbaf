"""``/api/v1``: the JSON API (predict, model info)."""

import base64
import binascii

from flask import Blueprint, jsonify, request

from contract import API_PREFIX
from serve import bodies, signatures
from serve.core import ServeError, Upload, parse_top_k
from serve.protocols import json_error, multipart, service, settings

bp = Blueprint("api", __name__, url_prefix=API_PREFIX)
bp.register_error_handler(ServeError, json_error)


def _uploads():
    """``([Upload], top_k field)`` from multipart files or JSON instances."""
    if multipart.is_multipart():
        fields, files = multipart.parse()
        if not files:
            raise ServeError('the multipart/form-data body has no file parts (send images in a field such as "file")')
        return [Upload(filename or name, data) for name, filename, data in files], fields.get("top_k")
    if request.mimetype == "application/json" or (request.data[:1] in (b"{", b"[")):
        body = bodies.request_json()
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list) or not instances:
            raise ServeError('JSON must be {"instances": [{"b64": "<base64 image>"}, ...]} with at least one instance')
        service().check_count(len(instances))  # before any base64 is decoded
        return [_instance(instance) for instance in instances], None
    raise ServeError('send images as multipart/form-data (field "file") or JSON {"instances": [{"b64": ...}]}')


def _instance(instance):
    encoded = instance.get("b64") if isinstance(instance, dict) else None
    if not isinstance(encoded, str):
        return Upload(error='is not {"b64": "<base64 image>"}')
    try:
        return Upload(data=base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        return Upload(error="is not valid base64")


@bp.post("/predict")
def predict():
    uploads, form_top_k = _uploads()
    top_k = parse_top_k(request.args.get("top_k") or form_top_k, settings().top_k)
    result = service().classify(uploads, top_k)
    body = {"model": {"name": result.model.name, "version": result.version, "architecture": result.model.architecture},
            "predictions": [image.public() for image in result.images]}
    if result.all_refused:
        body["error"] = "; ".join(image.error for image in result.images)
        return jsonify(body), result.images[0].status
    return jsonify(body)


@bp.get("/model")
def model():
    info = service().info()
    return jsonify(
        name=info.name,
        version=info.version,
        versions=list(info.versions),
        labels=dict(info.labels),
        architecture=info.architecture,
        class_names=list(info.class_names) if info.class_names is not None else None,
        confidence=_confidence(info.confidence),
        signatures=signatures.summary(info.signature_defs),
        backend=service().kind,
        runtime=info.runtime,
        skipped_versions=skipped_versions(info.skipped_versions),
    )


def _confidence(confidence):
    if confidence is None:
        return None
    return {"calibrated": confidence.calibrated, "temperature": confidence.temperature, "method": confidence.method,
            "threshold": confidence.threshold}


def skipped_versions(skipped):
    """``{version: reason}`` of versions passed over as ``[{"version", "reason"}]``, oldest first."""
    return [{"version": v, "reason": why} for v, why in sorted((skipped or {}).items())]
