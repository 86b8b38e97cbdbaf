"""``/v2``: the Open Inference Protocol (KServe v2) over HTTP, so that clients written for
Triton, KServe, Seldon MLServer or OpenVINO Model Server work against this server unchanged.

The model (``MODEL_NAME``) takes one of two inputs in a request: ``images``, UINT8
``[N, 32, 32, 3]`` raw RGB pixels, or ``image_bytes``, BYTES ``[N]`` encoded images (decoded by
the serving core, as ``/api/v1/predict``'s are). It answers ``probabilities`` (FP32
``[N, C]``), ``class_ids`` (INT64 ``[N]``) and ``class_names`` (BYTES ``[N]``). Extensions:
binary tensor data (inputs and outputs), classification (top-k of ``probabilities``).
Everything goes through :class:`serve.core.service.InferenceService`, so the routes work on
every backend.
"""

import importlib.metadata
import json

from flask import Blueprint, Response, current_app, jsonify

from contract import OUTPUT_PROBABILITIES, V2_PREFIX
from serve.core import ServeError
from serve.protocols import json_error, service
from serve.protocols.v2_request import HEADER_LENGTH, INPUTS, Binary, read_body, read_input, requested_outputs
from serve.protocols.v2_response import DATATYPES, classification, output_tensors, to_binary, to_json

bp = Blueprint("v2", __name__, url_prefix=V2_PREFIX)

SERVER_NAME = "cifar-tpu-pipeline"
EXTENSIONS = ("binary_tensor_data", "classification")
#: What ``platform`` says: Triton's name for a SavedModel (TF Serving runs one too), else the runtime's own name.
SAVEDMODEL_PLATFORM = "tensorflow_savedmodel"


bp.register_error_handler(ServeError, json_error)


@bp.get("")
def server_metadata():
    return jsonify(name=SERVER_NAME, version=server_version(), extensions=list(EXTENSIONS))


def server_version():
    """This server's package version, as the protocol's server metadata names it (HTTP and gRPC)."""
    try:
        return importlib.metadata.version(SERVER_NAME)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


@bp.get("/health/live")
def live():
    return Response(status=200)


@bp.get("/health/ready")
def ready():
    return _probe()


@bp.get("/models/<name>/ready")
@bp.get("/models/<name>/versions/<version>/ready")
def model_ready(name, version=None):
    service().model(name, version)
    return _probe()


def _probe():
    """200 with no body when the last probe prediction succeeded (the protocol's "true"), else 503 and why."""
    current_app.extensions["serve.readiness"].check()  # serve.health: at most one probe a second
    return Response(status=200)


@bp.get("/models/<name>")
@bp.get("/models/<name>/versions/<version>")
def model_metadata(name, version=None):
    return jsonify(metadata(name, service().model(name, version)))


def metadata(name, info):
    """A model's metadata as the protocol describes it (HTTP and gRPC): versions, platform, inputs, outputs."""
    runtime = info.runtime  # the local backend's (litert, litert-int8, savedmodel); none for TF Serving
    return {
        "name": name,
        "versions": [str(v) for v in info.versions],
        "platform": SAVEDMODEL_PLATFORM if runtime in (None, "savedmodel") else runtime,
        "inputs": [tensor(key, datatype, shape) for key, (datatype, shape) in INPUTS.items()],
        "outputs": [tensor(key, DATATYPES[key], [-1, info.num_classes] if key == OUTPUT_PROBABILITIES else [-1])
                    for key in info.outputs],
    }


@bp.post("/models/<name>/infer")
@bp.post("/models/<name>/versions/<version>/infer")
def infer(name, version=None):
    info = service().model(name, version)
    payload, binary = read_body()
    pixels = read_input(payload, Binary(binary))
    wanted = requested_outputs(payload, info.outputs)
    answer = service().infer(pixels, version=version, info=info)  # routed and counted above; names the version that answered
    tensors = output_tensors(answer.model, answer.outputs)
    response = {"model_name": name, "model_version": str(answer.version), "outputs": []}
    if "id" in payload:
        response["id"] = payload["id"]
    blobs = []
    for output, parameters in wanted:
        datatype, array = tensors[output]
        if parameters.get("classification"):
            datatype, array = "BYTES", classification(service().top_k(answer, parameters["classification"]))
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


def tensor(key, datatype, shape):
    """A tensor's metadata as the protocol writes it."""
    return {"name": key, "datatype": datatype, "shape": shape}
