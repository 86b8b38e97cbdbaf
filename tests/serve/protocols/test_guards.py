"""Every guard gives the same refusal through all six doors, in each protocol's own spelling.

The guards are the core's (serve/core/admission.py, serve/core/service.py, serve/core/tensors.py): no key, a wrong
key, more images than ``SERVE_MAX_IMAGES``, more pixels than ``SERVE_MAX_REQUEST_PIXELS``, a spent rate budget, a
passed deadline, an unknown version, a full queue. The doors are the JSON API as multipart and as JSON, TF
Serving's REST and gRPC APIs, and the Open Inference Protocol over REST and gRPC, each sending what its clients
send, over the fake backend: a refusal is an HTTP status with ``{"error"}``, or a gRPC status code with details.
"""

import base64
import contextlib
import itertools
import threading

import grpc
import numpy as np
import pytest

import contract
import grpc_servers
import synthetic
from fake_backend import FakeBackend, make_app
from tfs_protos import tensors
from tfs_protos.inference import grpc_predict_v2_pb2 as v2_pb, grpc_predict_v2_pb2_grpc
from tfs_protos.tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

MODEL = "cifar10"
KEYS = [f"key-{i}" for i in range(64)]
#: Seconds a call may take before the test gives up on it: generous, this is no timing test.
WAIT_S = 60
#: The deadline a caller gives in the deadline guard: the model is held past it, whatever the machine's speed.
DEADLINE_S = 0.3
DOORS = ("api-multipart", "api-json", "tfserving-rest", "tfserving-grpc", "v2-rest", "v2-grpc")
_fresh = itertools.count()


def _key():
    """A key no earlier case spent a budget of."""
    return KEYS[next(_fresh) % len(KEYS)]


def _images(count):
    return synthetic.make_images(count)[0][:count]


class Door:
    """One protocol's way in: a request of ``images`` (pixels, or encoded ones), with a key, a version, a deadline."""

    def __init__(self, name, app, target):
        self.name, self.app, self.target = name, app, target

    def send(self, images, encoded=False, key=None, version=None, deadline_s=None):
        """``(status or code, message)`` of the answer: an HTTP status and ``error``, or a gRPC code and details."""
        if self.name.endswith("grpc"):
            return self._grpc(images, encoded, key, version, deadline_s)
        return self._http(images, encoded, key, version, deadline_s)

    def _http(self, images, encoded, key, version, deadline_s):
        headers = {"X-API-Key": key} if key else {}
        if deadline_s is not None:
            headers["X-Request-Timeout"] = str(deadline_s)
        pngs = [synthetic.encode(image) for image in images]
        b64 = [base64.b64encode(png).decode() for png in pngs]
        where = f"/versions/{version}" if version is not None else ""
        if self.name == "api-multipart":
            query = f"?version={version}" if version is not None else ""
            kwargs = synthetic.multipart(*[(f"{i}.png", png) for i, png in enumerate(pngs)])
            answer = self.app.test_client().post(f"/api/v1/predict{query}", headers=headers, **kwargs)
        elif self.name == "api-json":
            query = f"?version={version}" if version is not None else ""
            answer = self.app.test_client().post(f"/api/v1/predict{query}", headers=headers,
                                                 json={"instances": [{"b64": b} for b in b64]})
        elif self.name == "tfserving-rest":
            body = ({"signature_name": contract.SIGNATURE_BYTES, "instances": [{"b64": b} for b in b64]} if encoded
                    else {"instances": np.asarray(images).tolist()})
            answer = self.app.test_client().post(f"/v1/models/{MODEL}{where}:predict", headers=headers, json=body)
        else:
            if encoded:
                tensor = {"name": contract.INPUT_BYTES, "datatype": "BYTES", "shape": [len(b64)], "data": b64,
                          "parameters": {"content_type": "base64"}}
            else:
                tensor = {"name": contract.INPUT_PIXELS, "datatype": "UINT8", "shape": list(np.shape(images)),
                          "data": np.asarray(images).ravel().tolist()}
            answer = self.app.test_client().post(f"/v2/models/{MODEL}{where}/infer", headers=headers,
                                                 json={"inputs": [tensor]})
        body = answer.get_json(silent=True) or {}
        return answer.status_code, body.get("error", ""), answer.headers

    def _grpc(self, images, encoded, key, version, deadline_s):
        metadata = (("x-api-key", key),) if key else ()
        timeout = WAIT_S if deadline_s is None else deadline_s
        with grpc.insecure_channel(self.target) as channel:
            try:
                if self.name == "tfserving-grpc":
                    request = predict_pb2.PredictRequest()
                    request.model_spec.name = MODEL
                    if version is not None:
                        request.model_spec.version.value = version
                    if encoded:
                        request.model_spec.signature_name = contract.SIGNATURE_BYTES
                        pngs = np.array([synthetic.encode(image) for image in images], dtype=object)
                        request.inputs[contract.INPUT_BYTES].CopyFrom(tensors.to_proto(pngs))
                    else:
                        request.inputs[contract.INPUT_PIXELS].CopyFrom(tensors.to_proto(np.asarray(images, np.uint8)))
                    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                    _, call = stub.Predict.with_call(request, metadata=metadata, timeout=timeout)
                else:
                    request = v2_pb.ModelInferRequest(model_name=MODEL, model_version=str(version or ""))
                    if encoded:
                        tensor = request.inputs.add(name=contract.INPUT_BYTES, datatype="BYTES", shape=[len(images)])
                        tensor.contents.bytes_contents.extend(synthetic.encode(image) for image in images)
                    else:
                        tensor = request.inputs.add(name=contract.INPUT_PIXELS, datatype="UINT8", shape=list(np.shape(images)))
                        request.raw_input_contents.append(np.asarray(images, np.uint8).tobytes())
                    stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel)
                    _, call = stub.ModelInfer.with_call(request, metadata=metadata, timeout=timeout)
            except grpc.RpcError as e:
                return e.code(), e.details() or "", dict(e.trailing_metadata() or ())
            return call.code(), "", dict(call.trailing_metadata() or ())


#: What each guard's refusal is, HTTP's and gRPC's, and words its message carries on every door.
REFUSALS = {
    "no key": (401, grpc.StatusCode.UNAUTHENTICATED, "needs an API key"),
    "wrong key": (401, grpc.StatusCode.UNAUTHENTICATED, "API key is not valid"),
    "over the image cap": (413, grpc.StatusCode.INVALID_ARGUMENT, "SERVE_MAX_IMAGES"),
    "over the pixel budget": (413, grpc.StatusCode.INVALID_ARGUMENT, "SERVE_MAX_REQUEST_PIXELS"),
    "past the rate limit": (429, grpc.StatusCode.RESOURCE_EXHAUSTED, "too many requests"),
    "past a deadline": (504, grpc.StatusCode.DEADLINE_EXCEEDED, ""),
    "unknown version": (404, grpc.StatusCode.NOT_FOUND, "7"),
    "a full queue": (503, grpc.StatusCode.UNAVAILABLE, "SERVE_MAX_QUEUE"),
}


@contextlib.contextmanager
def _server(backend=None, **settings):
    app = make_app(backend or FakeBackend(), API_KEYS=",".join(KEYS), **settings)
    with grpc_servers.serving(app) as target:
        yield app, target


@pytest.fixture(scope="module")
def guarded():
    """One app for the guards that need no state of their own: keys on, two images a request, 1.5 images' pixels."""
    with _server(MAX_IMAGES=2, MAX_REQUEST_PIXELS=32 * 32 * 3 // 2) as served:
        yield served


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("guard", list(REFUSALS))
def test_every_guard_refuses_alike_through_every_door(guarded, guard, door):
    app, target = guarded
    status, code, words = REFUSALS[guard]
    images = _images(1)
    if guard == "a full queue":
        backend = FakeBackend()
        backend.hold = threading.Event()
        with _server(backend, MAX_QUEUE=1) as (queued_app, queued_target):
            holder = Door("api-json", queued_app, queued_target)
            first = threading.Thread(target=holder.send, args=(images,), kwargs={"key": _key()})
            first.start()
            try:
                assert backend.entered.wait(WAIT_S)
                got, message, headers = Door(door, queued_app, queued_target).send(images, key=_key())
            finally:
                backend.hold.set()
                first.join(WAIT_S)
        assert {k.lower(): v for k, v in headers.items()}.get("retry-after") == "1"
    elif guard == "past a deadline":
        backend = FakeBackend()
        backend.hold = threading.Event()  # never set while the call waits: the model outlasts any deadline
        with _server(backend) as (held_app, held_target):
            try:
                got, message, _ = Door(door, held_app, held_target).send(images, key=_key(), deadline_s=DEADLINE_S)
            finally:
                backend.hold.set()
    else:
        send = Door(door, app, target).send
        if guard == "no key":
            got, message, _ = send(images)
        elif guard == "wrong key":
            got, message, _ = send(images, key="not-a-key")
        elif guard == "over the image cap":
            got, message, _ = send(_images(3), encoded=door.startswith("api"), key=_key())
        elif guard == "over the pixel budget":
            got, message, _ = send(_images(2), encoded=True, key=_key())
        elif guard == "past the rate limit":
            with _server(RATE_LIMIT_API="1/minute") as (limited_app, limited_target):
                send = Door(door, limited_app, limited_target).send
                first, _, _ = send(images, key=KEYS[0])
                assert first in (200, grpc.StatusCode.OK)
                got, message, _ = send(images, key=KEYS[0])
        else:
            got, message, _ = send(images, key=_key(), version=7)
    assert got == (code if door.endswith("grpc") else status), (guard, door, got, message)
    assert words in message, (guard, door, message)


def test_the_doors_answer_when_no_guard_refuses(guarded):
    """The matrix proves nothing unless each door, sent a request every guard lets through, is answered."""
    app, target = guarded
    for door in DOORS:
        got, message, _ = Door(door, app, target).send(_images(1), encoded=True, key=_key())
        assert got in (200, grpc.StatusCode.OK), (door, got, message)
