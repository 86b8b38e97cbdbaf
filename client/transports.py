"""Four ways to reach a model: this project's HTTP API, TF Serving's REST API, TF Serving's gRPC API, and the
Open Inference Protocol (KServe v2) that Triton, KServe, MLServer and this project's server speak.

Each transport has the same three calls: ``predict(batch, top_k)`` with ``batch`` a list of
``(filename, bytes)`` returns one result dict per image, in order (``label``, ``class_id``,
``probability``, ``top_k``, ``ood_score`` and ``in_distribution``, None where the model has no
such output; or ``error`` and ``status``), ``health()`` returns a dict describing a
ready model, and ``info()`` the model's name, version, classes and signatures. They raise
:class:`Unreachable` when there is no ready server to talk to, and :class:`RequestFailed` when the
server refused a whole request. None of them imports TensorFlow.
"""

import json
import struct
from urllib.parse import quote

import contract

#: TF Serving reports the top class's name; the others are known only by id.
UNKNOWN_LABEL = None
#: Statuses that mean "not now": the request is sent again after the server's Retry-After.
RETRY_STATUSES = (429, 503)
DEFAULT_RETRIES = 3
#: The longest Retry-After a client waits out; a server asking for longer is waited on for this long.
DEFAULT_MAX_WAIT_S = 30.0


class Unreachable(Exception):
    """No server answers at the address, or it answers that it is not ready."""


class RequestFailed(Exception):
    """The server refused a request as a whole; ``status`` is its HTTP status (or gRPC code name)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def authorize(transport, api_key):
    """Send ``api_key`` as ``Authorization: Bearer`` on every request of an HTTP transport; return it.

    gRPC goes straight to TF Serving, which has no keys, so a key is not sent there."""
    session = getattr(transport, "session", None)
    if api_key and session is not None:
        session.headers["Authorization"] = f"Bearer {api_key}"
    return transport


def top_k_from_probabilities(probabilities, k, names):
    """[{label, class_id, probability}] for the ``k`` most probable classes, best first (:mod:`contract.ranking`)."""
    from contract.ranking import top_k

    order, best = top_k(probabilities, k)
    return [{"label": names.get(i, UNKNOWN_LABEL), "class_id": i, "probability": p} for i, p in zip(order.tolist(), best.tolist())]


class _HttpTransport:
    """What the HTTP transports share: one requests session, and unreachable or not-ready as :class:`Unreachable`.

    A 429 or 503 is sent again, the same request whole, after the server's ``Retry-After`` (at
    most ``max_wait_s`` a time; without the header, 0.5, 1, 2 s...), up to ``retries`` times
    (urllib3's ``Retry``); the last refusal is then the answer.
    """

    def __init__(self, url, timeout, retries=DEFAULT_RETRIES, max_wait_s=DEFAULT_MAX_WAIT_S):
        import requests
        from requests.adapters import HTTPAdapter
        from urllib3.util import Retry

        self._requests = requests
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        retry = Retry(
            total=retries, connect=0, read=0, redirect=0, other=0, status=retries,
            status_forcelist=RETRY_STATUSES, allowed_methods=None,  # POST too: a refused request was not run
            respect_retry_after_header=True, retry_after_max=int(max_wait_s), backoff_factor=0.5,
            backoff_max=max_wait_s, raise_on_status=False,
        )
        for prefix in ("http://", "https://"):
            self.session.mount(prefix, HTTPAdapter(max_retries=retry))

    def _send(self, method, url, **kwargs):
        try:
            return self.session.request(method, url, timeout=self.timeout, **kwargs)
        except self._requests.RequestException as error:
            raise Unreachable(f"cannot reach {self.url}: {type(error).__name__}") from error

    def _raise_if_not_ready(self, response, body):
        if response.status_code == 503:
            raise Unreachable(f"{self.url} is not ready: {_reason(body, response)}")


class ApiTransport(_HttpTransport):
    """This project's server: ``POST /api/v1/predict``, ``GET /readyz``, ``GET /api/v1/model``."""

    def _call(self, method, path, **kwargs):
        response = self._send(method, self.url + path, **kwargs)
        body = _json_or_none(response)
        self._raise_if_not_ready(response, body)
        return response, body

    def predict(self, batch, top_k):
        files = [("file", (name, data, "application/octet-stream")) for name, data in batch]
        response, body = self._call("POST", "/api/v1/predict", files=files, data={"top_k": str(top_k)})
        predictions = (body or {}).get("predictions") if isinstance(body, dict) else None
        if isinstance(predictions, list) and len(predictions) == len(batch):
            return [_api_result(p, response.status_code) for p in predictions]
        if response.status_code != 200:
            raise RequestFailed(_reason(body, response), response.status_code)
        raise RequestFailed(f"unexpected answer from {self.url}/api/v1/predict", response.status_code)

    def health(self):
        response, body = self._call("GET", "/readyz")
        if response.status_code != 200:
            raise Unreachable(f"{self.url} is not ready: {_reason(body, response)}")
        return body if isinstance(body, dict) else {"status": "ready"}

    def info(self):
        response, body = self._call("GET", "/api/v1/model")
        if response.status_code != 200 or not isinstance(body, dict):
            raise RequestFailed(_reason(body, response), response.status_code)
        return body


def _api_result(prediction, http_status):
    if "error" in prediction:
        return {"error": prediction["error"], "status": prediction.get("status", http_status)}
    return {
        "label": prediction.get("label"),
        "class_id": prediction.get("class_id"),
        "probability": prediction.get("probability"),
        "top_k": prediction.get("top_k", []),
        "ood_score": prediction.get("ood_score"),
        "in_distribution": prediction.get("in_distribution"),
    }


def _json_or_none(response):
    try:
        return response.json()
    except ValueError:
        return None


def _reason(body, response):
    if isinstance(body, dict) and body.get("error"):
        return str(body["error"])
    return f"HTTP {response.status_code} {response.reason or ''}".strip()


def _with_bad(batch, bad, predict_good):
    """One result per image of ``batch``: ``predict_good()`` for the decoded ones, an error for each of ``bad``."""
    good = predict_good() if len(bad) < len(batch) else []
    answers = iter(good)
    return [{"error": bad[i], "status": None} if i in bad else next(answers) for i in range(len(batch))]


class TFServingRestTransport(_HttpTransport):
    """TF Serving's REST API: images decoded here (:mod:`client.images`), uint8 pixels to ``serving_default``."""

    def __init__(self, url, model, timeout, **retry):
        super().__init__(url, timeout, **retry)
        self.model = model
        self.names = {}  # class id -> name, learned from the answers (TF Serving names only the top class)

    def _call(self, method, path, **kwargs):
        response = self._send(method, f"{self.url}/v1/models/{self.model}{path}", **kwargs)
        body = _json_or_none(response)
        self._raise_if_not_ready(response, body)
        if response.status_code != 200:
            raise RequestFailed(_reason(body, response), response.status_code)
        return body

    def predict(self, batch, top_k):
        from client import images

        pixels, bad = images.decode_batch(batch)

        def predict_good():
            body = {"signature_name": contract.SIGNATURE_PIXELS, "instances": pixels.tolist()}
            predictions = self._call("POST", ":predict", json=body)["predictions"]
            results = []
            for row in predictions:
                class_id = int(row[contract.OUTPUT_CLASS_IDS])
                self.names[class_id] = row[contract.OUTPUT_CLASS_NAMES]
                results.append(_tfs_result(row[contract.OUTPUT_PROBABILITIES], class_id, top_k, self.names,
                                           row.get(contract.OUTPUT_OOD_SCORE), row.get(contract.OUTPUT_IN_DISTRIBUTION)))
            return results

        return _with_bad(batch, bad, predict_good)

    def health(self):
        body = self._call("GET", "")
        states = body.get("model_version_status", [])
        if not any(s.get("state") == "AVAILABLE" for s in states):
            raise Unreachable(f"model {self.model} at {self.url} is not available: {states}")
        return {"status": "ready", "model": self.model, "versions": [int(s["version"]) for s in states if s.get("state") == "AVAILABLE"]}

    def info(self):
        body = self._call("GET", "/metadata")
        signatures = body["metadata"]["signature_def"]["signature_def"]
        return {
            "name": body["model_spec"]["name"],
            "version": int(body["model_spec"]["version"]),
            "class_names": None,
            "signatures": {name: _signature_summary(sig) for name, sig in signatures.items() if not name.startswith("__")},
            "backend": f"tfserving-rest {self.url}",
        }


def _signature_summary(signature):
    return {
        "inputs": sorted(signature.get("inputs", {})),
        "outputs": sorted(signature.get("outputs", {})),
    }


def _tfs_result(probabilities, class_id, top_k, names, ood_score=None, in_distribution=None):
    probabilities = [float(p) for p in probabilities]
    return {
        "label": names.get(class_id),
        "class_id": class_id,
        "probability": probabilities[class_id],
        "top_k": top_k_from_probabilities(probabilities, top_k, names),
        "ood_score": None if ood_score is None else float(ood_score),
        "in_distribution": None if in_distribution is None else bool(in_distribution),
    }


class TFServingGrpcTransport:
    """TF Serving's gRPC ``PredictionService``/``ModelService``, through the vendored protos."""

    def __init__(self, target, model, timeout):
        import grpc

        from tfs_protos.tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        self._grpc = grpc
        self.target = target
        self.model = model
        self.timeout = timeout
        self.channel = grpc.insecure_channel(target)
        self.predictions = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.names = {}

    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout)
        except self._grpc.RpcError as error:
            code, details = error.code(), error.details()
            if code in (self._grpc.StatusCode.UNAVAILABLE, self._grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unreachable(f"cannot reach {self.target}: {code.name}") from error
            raise RequestFailed(details or code.name, code.name) from error

    def predict(self, batch, top_k):
        from client import images

        pixels, bad = images.decode_batch(batch)
        return _with_bad(batch, bad, lambda: self._predict_pixels(pixels, top_k))

    def _predict_pixels(self, pixels, top_k):
        """``serving_default`` on uint8 ``pixels``, as TF Serving's clients send a uint8 tensor."""
        from tfs_protos import tensors
        from tfs_protos.tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        request.model_spec.name = self.model
        request.model_spec.signature_name = contract.SIGNATURE_PIXELS
        request.inputs[contract.INPUT_PIXELS].CopyFrom(tensors.to_proto(pixels))
        outputs = self._call(self.predictions.Predict, request).outputs
        probabilities = tensors.to_array(outputs[contract.OUTPUT_PROBABILITIES]).reshape(len(pixels), -1).tolist()
        class_ids = tensors.to_array(outputs[contract.OUTPUT_CLASS_IDS]).reshape(-1).tolist()
        class_names = [n.decode("utf-8") for n in tensors.to_array(outputs[contract.OUTPUT_CLASS_NAMES]).reshape(-1).tolist()]
        self.names.update(zip(class_ids, class_names))
        scores, inside = ([tensors.to_array(outputs[key]).reshape(-1).tolist() if key in outputs else [None] * len(pixels)
                           for key in (contract.OUTPUT_OOD_SCORE, contract.OUTPUT_IN_DISTRIBUTION)])
        return [_tfs_result(probabilities[i], class_ids[i], top_k, self.names, scores[i], inside[i])
                for i in range(len(pixels))]

    def health(self):
        from tfs_protos.tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = self.model
        response = self._call(self.models.GetModelStatus, request)
        available = get_model_status_pb2.ModelVersionStatus.AVAILABLE
        versions = [s.version for s in response.model_version_status if s.state == available]
        if not versions:
            raise Unreachable(f"model {self.model} at {self.target} has no available version")
        return {"status": "ready", "model": self.model, "versions": versions}

    def info(self):
        from tfs_protos.tensorflow.core.protobuf import meta_graph_pb2  # noqa: F401  (SignatureDef, for Unpack)
        from tfs_protos.tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest()
        request.model_spec.name = self.model
        request.metadata_field.append("signature_def")
        response = self._call(self.predictions.GetModelMetadata, request)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)
        return {
            "name": response.model_spec.name,
            "version": response.model_spec.version.value,
            "class_names": None,
            "signatures": {
                name: {"inputs": sorted(sig.inputs), "outputs": sorted(sig.outputs)}
                for name, sig in signature_map.signature_def.items()
                if not name.startswith("__")
            },
            "backend": f"tfserving-grpc {self.target}",
        }


class V2Transport(_HttpTransport):
    """The Open Inference Protocol over HTTP: the files' bytes as a BYTES tensor in the binary tensor data
    extension, the top k through the classification extension (``"<probability>:<class id>[:<label>]"``)."""

    def __init__(self, url, model, timeout, **retry):
        super().__init__(url, timeout, **retry)
        self.model = model
        self._confidence = None  # the confidence outputs the model has, learned from its metadata

    def _call(self, method, path, **kwargs):
        response = self._send(method, f"{self.url}/v2{path}", **kwargs)
        header_length = response.headers.get("Inference-Header-Content-Length")
        try:
            body = json.loads(response.content[: int(header_length)] if header_length else response.content)
        except ValueError:
            body = None
        self._raise_if_not_ready(response, body)
        return response, body

    def _model_path(self):
        return f"/models/{quote(self.model, safe='')}"

    def predict(self, batch, top_k):
        tensor = b"".join(struct.pack("<I", len(data)) + data for _, data in batch)
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": contract.INPUT_BYTES,
                        "shape": [len(batch)],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(tensor)},
                    }
                ],
                "outputs": [
                    {"name": contract.OUTPUT_PROBABILITIES, "parameters": {"classification": top_k, "binary_data": False}},
                    *({"name": name, "parameters": {"binary_data": False}} for name in self._confidence_outputs()),
                ],
            }
        ).encode()
        response, body = self._call(
            "POST",
            f"{self._model_path()}/infer",
            data=header + tensor,
            headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
        )
        if response.status_code != 200:
            raise RequestFailed(_reason(body, response), response.status_code)
        try:
            (output,) = [o for o in body["outputs"] if o["name"] == contract.OUTPUT_PROBABILITIES]
            rows, k = output["shape"]
            cells = [_classification(cell) for cell in output["data"]]
            extra = {o["name"]: list(o["data"]) for o in body["outputs"] if o["name"] in self.CONFIDENCE}
        except (KeyError, TypeError, ValueError) as error:
            raise RequestFailed(f"unexpected answer from {self.url}: {type(error).__name__}: {error}", response.status_code) from None
        if rows != len(batch) or len(cells) != rows * k:
            raise RequestFailed(f"unexpected answer from {self.url}: {rows} rows for {len(batch)} images", response.status_code)
        results = []
        for row in range(rows):
            ranked = cells[row * k : (row + 1) * k]
            best = ranked[0]
            score, inside = (extra.get(name, [None] * rows)[row] for name in self.CONFIDENCE)
            results.append({"label": best["label"], "class_id": best["class_id"], "probability": best["probability"],
                            "top_k": ranked, "ood_score": score, "in_distribution": inside})
        return results

    #: The outputs that say how foreign an image looks, asked for when the model has them.
    CONFIDENCE = (contract.OUTPUT_OOD_SCORE, contract.OUTPUT_IN_DISTRIBUTION)

    def _confidence_outputs(self):
        """Which of :data:`CONFIDENCE` the model has, from its metadata (asked once)."""
        if self._confidence is None:
            response, body = self._call("GET", self._model_path())
            if response.status_code != 200 or not isinstance(body, dict):
                raise RequestFailed(_reason(body, response), response.status_code)
            names = {o.get("name") for o in body.get("outputs", []) if isinstance(o, dict)}
            self._confidence = [name for name in self.CONFIDENCE if name in names]
        return self._confidence

    def health(self):
        response, body = self._call("GET", f"{self._model_path()}/ready")
        if response.status_code in (401, 403, 404, 429):  # no key, a wrong one, no such model, too many requests
            raise RequestFailed(_reason(body, response), response.status_code)
        if response.status_code != 200:  # the protocol says "not ready" with any other 4xx
            raise Unreachable(f"model {self.model} at {self.url} is not ready: {_reason(body, response)}")
        return {"status": "ready", "model": self.model, "versions": self.info()["versions"]}

    def info(self):
        response, body = self._call("GET", self._model_path())
        if response.status_code != 200 or not isinstance(body, dict):
            raise RequestFailed(_reason(body, response), response.status_code)
        versions = [str(v) for v in body.get("versions") or []]
        if all(v.isdigit() for v in versions):
            versions = sorted(int(v) for v in versions)

        def tensors(entries):
            return {t["name"]: {"datatype": t.get("datatype"), "shape": t.get("shape")} for t in entries or []}

        return {
            "name": body.get("name"),
            "version": max(versions) if versions else None,
            "versions": versions,
            "class_names": None,
            "signatures": {"infer": {"inputs": tensors(body.get("inputs")), "outputs": tensors(body.get("outputs"))}},
            "backend": f"v2 {self.url} ({body.get('platform')})",
        }


def _classification(cell):
    """One classification-extension string ``"<value>:<index>[:<label>]"`` as ``{label, class_id, probability}``."""
    value, index, *label = cell.split(":", 2)
    return {"label": label[0] if label else UNKNOWN_LABEL, "class_id": int(index), "probability": float(value)}
