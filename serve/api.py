"""``/api/v1``: the JSON API (predict, model info)."""

import base64
import binascii

from flask import Blueprint, current_app, jsonify, request

from serve import bodies, classify, served, signatures, uploads
from serve.errors import ServeError, check_image_count

bp = Blueprint("api", __name__, url_prefix="/api/v1")


def _uploads():
    """``([classify.Upload], top_k field)`` from multipart files or JSON instances."""
    if uploads.is_multipart():
        fields, files = uploads.parse()
        if not files:
            raise ValueError('the multipart/form-data body has no file parts (send images in a field such as "file")')
        check_image_count(len(files), current_app.config["MAX_IMAGES"])
        return [classify.Upload(filename or name, data) for name, filename, data in files], fields.get("top_k")
    if request.mimetype == "application/json" or (request.data[:1] in (b"{", b"[")):
        body = bodies.request_json()
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list) or not instances:
            raise ValueError('JSON must be {"instances": [{"b64": "<base64 image>"}, ...]} with at least one instance')
        check_image_count(len(instances), current_app.config["MAX_IMAGES"])
        images = []
        for instance in instances:
            encoded = instance.get("b64") if isinstance(instance, dict) else None
            if not isinstance(encoded, str):
                images.append(classify.Upload(error='is not {"b64": "<base64 image>"}'))
                continue
            try:
                images.append(classify.Upload(data=base64.b64decode(encoded, validate=True)))
            except (binascii.Error, ValueError):
                images.append(classify.Upload(error="is not valid base64"))
        return images, None
    raise ValueError('send images as multipart/form-data (field "file") or JSON {"instances": [{"b64": ...}]}')


@bp.post("/predict")
def predict():
    try:
        images, form_top_k = _uploads()
        top_k = classify.parse_top_k(request.args.get("top_k") or form_top_k, current_app.config["TOP_K"])
    except ServeError as e:
        return jsonify(error=str(e)), e.status
    except ValueError as e:
        return jsonify(error=str(e)), 400
    try:
        meta, slots = current_app.extensions["serve.classifier"].classify(images, top_k)
    except ServeError as e:
        return jsonify(error=str(e)), e.status
    body = {"model": classify.model_info(meta), "predictions": [classify.public(s) for s in slots]}
    bad = [s for s in slots if "error" in s]
    if bad and len(bad) == len(slots):
        body["error"] = "; ".join(s["error"] for s in bad)
        return jsonify(body), bad[0]["status"]
    return jsonify(body)


@bp.get("/model")
def model():
    backend = current_app.extensions["serve.backend"]
    try:
        meta = backend.metadata()
    except ServeError as e:
        return jsonify(error=str(e)), e.status
    return jsonify(
        name=meta["name"],
        version=meta["version"],
        versions=meta["versions"],
        architecture=meta["architecture"],
        class_names=meta["class_names"],
        confidence=meta.get("confidence"),
        signatures=signatures.summary(meta["signature_defs"]),
        backend=backend.kind,
        runtime=meta.get("runtime"),
        skipped_versions=served.skipped_versions(meta.get("skipped_versions")),
    )
