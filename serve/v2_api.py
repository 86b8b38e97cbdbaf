"""``/v2``: the Open Inference Protocol (KServe v2) over HTTP, so that clients written for
Triton, KServe, Seldon MLServer or OpenVINO Model Server work against this server unchanged.

The model (``MODEL_NAME``) takes one of two inputs in a request: ``images``, UINT8
``[N, 32, 32, 3]`` raw RGB pixels, or ``image_bytes``, BYTES ``[N]`` encoded images (decoded by
:mod:`serve.images`, as ``/api/v1/predict`` decodes them). It answers ``probabilities`` (FP32
``[N, C]``), ``class_ids`` (INT64 ``[N]``) and ``class_names`` (BYTES ``[N]``). Extensions:
binary tensor data (inputs and outputs), classification (top-k of ``probabilities``).
Everything goes through the backend's ``predict``/``run``/``ready``/``metadata``, so the
routes work on every backend.
"""

import importlib.metadata
import json

from flask import Blueprint, Response, current_app, jsonify

from contract import INPUT_PIXELS, OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, OUTPUT_PROBABILITIES, SIGNATURE_PIXELS
from serve import served, signatures
from serve.errors import ServeError
from serve.v2_request import HEADER_LENGTH, INPUTS, Binary, read_body, read_input, requested_outputs
from serve.v2_response import CONFIDENCE_OUTPUTS, classification, output_names, output_tensors, to_binary, to_json

bp = Blueprint("v2", __name__, url_prefix="/v2")

SERVER_NAME = "cifar-tpu-pipeline"
EXTENSIONS = ("binary_tensor_data", "classification")
#: What ``platform`` says: Triton's name for a SavedModel (TF Serving runs one too), else the runtime's own name.
SAVEDMODEL_PLATFORM = "tensorflow_savedmodel"


@bp.errorhandler(ServeError)
def _error(e):
    return jsonify(error=str(e)), e.status


@bp.get("")
def server_metadata():
    try:
        version = importlib.metadata.version(SERVER_NAME)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        version = "unknown"
    return jsonify(name=SERVER_NAME, version=version, extensions=list(EXTENSIONS))


@bp.get("/health/live")
def live():
    return Response(status=200)


@bp.get("/health/ready")
def ready():
    return _probe()


@bp.get("/models/<name>/ready")
@bp.get("/models/<name>/versions/<version>/ready")
def model_ready(name, version=None):
    _meta(name, version)
    return _probe()


def _probe():
    """200 with no body when the last probe prediction succeeded (the protocol's "true"), else 503 and why."""
    current_app.extensions["serve.readiness"].check()  # serve.health: at most one probe a second
    return Response(status=200)


@bp.get("/models/<name>")
@bp.get("/models/<name>/versions/<version>")
def model_metadata(name, version=None):
    meta = _meta(name, version)
    runtime = meta.get("runtime")  # the local backend's (litert, litert-int8, savedmodel); none for TF Serving
    return jsonify(
        name=name,
        versions=[str(v) for v in meta["versions"]],
        platform=SAVEDMODEL_PLATFORM if runtime in (None, "savedmodel") else runtime,
        inputs=[tensor(key, datatype, shape) for key, (datatype, shape) in INPUTS.items()],
        outputs=[
            tensor(OUTPUT_PROBABILITIES, "FP32", [-1, _num_classes(meta)]),
            tensor(OUTPUT_CLASS_IDS, "INT64", [-1]),
            tensor(OUTPUT_CLASS_NAMES, "BYTES", [-1]),
            *(tensor(key, CONFIDENCE_OUTPUTS[key], [-1]) for key in output_names(meta)[3:]),
        ],
    )


@bp.post("/models/<name>/infer")
@bp.post("/models/<name>/versions/<version>/infer")
def infer(name, version=None):
    meta = _meta(name, version)
    payload, binary = read_body()
    pixels = read_input(payload, Binary(binary))
    wanted = requested_outputs(payload, output_names(meta))
    served = meta["version"] if version is None else int(version)
    backend = current_app.extensions["serve.backend"]
    if served == meta["version"]:
        outputs = backend.predict(pixels)  # micro-batched with every other request
    else:  # an older version that a TF Serving backend still serves
        outputs = backend.run(SIGNATURE_PIXELS, {INPUT_PIXELS: pixels}, served)
    current_app.extensions["serve.metrics"].images.inc(len(pixels))
    current_app.extensions["serve.metrics"].answers(served, outputs)
    tensors = output_tensors(meta, outputs)
    response = {"model_name": name, "model_version": str(served), "outputs": []}
    if "id" in payload:
        response["id"] = payload["id"]
    blobs = []
    for output, parameters in wanted:
        datatype, array = tensors[output]
        if parameters.get("classification"):
            datatype, array = "BYTES", classification(meta, outputs, tensors, parameters["classification"])
        entry = {"name": output, "datatype": datatype, "shape": list(array.shape)}
        if parameters.get("binary_data"):
            blob = to_binary(datatype, array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = to_json(datatype, array)
        response["outputs"].append(entry)
    if not blobs:
        return jsonify(response)
    header = json.dumps(response, separators=(",", ":")).encode()
    return Response(
        b"".join([header, *blobs]), mimetype="application/octet-stream", headers={HEADER_LENGTH: str(len(header))}
    )


# -- the model and its versions ----------------------------------------------------------
def tensor(key, datatype, shape):
    """A tensor's metadata as the protocol writes it."""
    return {"name": key, "datatype": datatype, "shape": shape}


def _meta(name, version):
    """The backend's metadata, after a 404 in this protocol's words for a model or version this server does not serve."""
    return served.metadata(
        name, version,
        unknown_model=lambda name: f"unknown model {name!r}; this server serves {current_app.config['MODEL_NAME']!r}",
        unknown_version=lambda name, version, versions: (
            f"model {name!r} has no version {version!r} (available: {', '.join(str(v) for v in versions)})"
        ),
    )


def _num_classes(meta):
    probabilities = signatures.summary(meta.get("signature_defs") or {}).get(SIGNATURE_PIXELS, {}).get("outputs", {}).get(OUTPUT_PROBABILITIES)
    shape = (probabilities or {}).get("shape") or []
    if len(shape) == 2 and shape[1] > 0:
        return shape[1]
    return len(meta["class_names"]) if meta.get("class_names") else -1
