"""``/api/v1``: the JSON API (predict, model info): uploads in, each image's answer out.

``POST /api/v1/predict`` takes files (multipart) or ``{"instances": [{"b64": ...}]}``, and in its query ``top_k``,
and ``version`` or ``label`` to ask a version other than the newest (as TF Serving's URLs do).
"""

import base64
import binascii

from flask import Blueprint, jsonify, request

from contract import API_PREFIX, INPUT_BYTES, SIGNATURE_BYTES
from serve.core.errors import BadRequest, echo
from serve.core.request import Tensor, Upload
from serve.http import bodies
from serve.http.health import skipped_versions
from serve.protocols import http_request, multipart, service

bp = Blueprint("api", __name__, url_prefix=API_PREFIX)


def uploads():
    """``([Upload], top_k field)`` from multipart files or JSON ``{"instances": [{"b64": ...}]}``."""
    if multipart.is_multipart():
        fields, files = multipart.parse()
        if not files:
            raise BadRequest('the multipart/form-data body has no file parts (send images in a field such as "file")')
        return [Upload(filename or name, data) for name, filename, data in files], fields.get("top_k")
    if request.mimetype == "application/json" or (request.data[:1] in (b"{", b"[")):
        body = bodies.request_json()
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list) or not instances:
            raise BadRequest('JSON must be {"instances": [{"b64": "<base64 image>"}, ...]} with at least one instance')
        return [_instance(instance) for instance in instances], None
    raise BadRequest('send images as multipart/form-data (field "file") or JSON {"instances": [{"b64": ...}]}')


def _instance(instance):
    encoded = instance.get("b64") if isinstance(instance, dict) else None
    if not isinstance(encoded, str):
        return Upload(error='is not {"b64": "<base64 image>"}')
    try:
        return Upload(data=base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        return Upload(error="is not valid base64")


def parse_top_k(value):
    """``top_k`` from a query or form value (None: the server's default); a 400 when it is not a whole number."""
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"top_k must be a whole number, got {echo(value)}") from None


def classify(images, top_k, version=None, label=None):
    """The core's answer to ``images`` (a list of :class:`Upload`), each image answered on its own, by ``version`` or
    ``label`` (neither: the newest)."""
    return service().infer(http_request({INPUT_BYTES: Tensor(images)}, signature=SIGNATURE_BYTES, top_k=top_k,
                                        per_image=True, version=version, label=label))


@bp.post("/predict")
def predict():
    images, form_top_k = uploads()
    args = request.args
    answer = classify(images, parse_top_k(args.get("top_k") or form_top_k), args.get("version") or None,
                      args.get("label") or None)
    body = {"model": {"name": answer.model.name, "version": answer.version, "architecture": answer.model.architecture},
            "predictions": [image.public() for image in answer.images]}
    if answer.all_refused:
        body["error"] = "; ".join(str(image.error) for image in answer.images)
        return jsonify(body), answer.images[0].status
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
        confidence=None if info.confidence is None else vars_of(info.confidence),
        signatures={name: {"inputs": _tensors(sig.inputs), "outputs": _tensors(sig.outputs)}
                    for name, sig in sorted(info.signatures.items())},
        backend=service().kind,
        runtime=info.runtime,
        skipped_versions=skipped_versions(info.skipped_versions),
    )


def vars_of(confidence):
    return {"calibrated": confidence.calibrated, "temperature": confidence.temperature, "method": confidence.method,
            "threshold": confidence.threshold}


def _tensors(specs):
    """``{key: {"dtype", "shape"}}`` as this API summarises a signature's tensors (``uint8``, ``[-1, 32, 32, 3]``)."""
    return {key: {"dtype": spec.dtype.removeprefix("DT_").lower(), "shape": None if spec.shape is None else list(spec.shape)}
            for key, spec in sorted(specs.items())}
