"""TF Serving as the backend: its REST API or its gRPC ``PredictionService``, with what the two share.

With traces on (:mod:`serve.tracing`) every call to TF Serving is a client span (``tfserving GET``,
``tfserving POST``, ``tfserving Predict``...) whose context goes with the call: a ``traceparent``
header over REST, ``traceparent`` metadata over gRPC.
"""

import dataclasses
import json
import os
import threading
import time

import numpy as np

from contract import INPUT_PIXELS, OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, OUTPUT_PROBABILITIES, SIGNATURE_PIXELS
from serve.backends import published, signatures
from serve.core.errors import BadRequest, NotFound, NotServed, ServeError, Shed, Unavailable
from serve.core.model import ModelInfo, Prediction, readiness_images
from serve.telemetry import tracing
from tfs_protos import tensors

METADATA_TTL_S = 30.0  # how long a TF Serving backend trusts the metadata it fetched
#: Most bytes of one TF Serving answer read: far above a 256-image answer, far below a worker's memory.
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class _RemoteBackend:
    """What the two TF Serving backends share: cached metadata, the manifest, the probe, and
    requests split into batches of at most ``max_batch`` rows (0: never split).

    TF Serving with ``--enable_batching`` refuses a request larger than its ``max_batch_size``
    (``deploy/batching.config``: 128) with INVALID_ARGUMENT, so a bigger request is sent as
    several, one after the other, and the answers are put back together in order.
    """

    def __init__(self, name, timeout_s, model_dir=None, on_batch=None, *, max_batch):
        self.name = name
        self.timeout_s = float(timeout_s)
        self.max_batch = int(max_batch or 0)
        self._on_batch = on_batch
        self._meta = None
        self._meta_at = 0.0
        self._lock = threading.Lock()
        # TF Serving does not expose assets.extra; read the manifest where the files are at hand.
        self._manifest = None
        if model_dir:
            available = published.versions(model_dir)
            if available:
                self._manifest = published.manifest(os.path.join(str(model_dir), str(available[-1])))

    @property
    def loaded(self):
        return True  # TF Serving loads the model; ready() asks it

    def info(self, version=None):
        info = self._info()
        if version is None or int(version) == info.version:
            return info
        if int(version) not in info.versions:
            raise NotServed(f"model {self.name!r} has no version {version}", name=self.name, version=version,
                            versions=info.versions)
        return dataclasses.replace(info, version=int(version))

    def _info(self):
        with self._lock:
            if self._meta is not None and time.monotonic() - self._meta_at < METADATA_TTL_S:
                return self._meta
        typed, versions = self._fetch_metadata()
        info = ModelInfo.build(self.name, max(versions) if versions else None, typed, self._manifest,
                               versions=tuple(sorted(versions)))
        with self._lock:
            self._meta, self._meta_at = info, time.monotonic()
        return info

    def infer(self, images, version=None, deadline=None):
        outputs = self.run(SIGNATURE_PIXELS, {INPUT_PIXELS: images}, version, deadline)
        if self._on_batch is not None:
            step = self.max_batch or len(images) or 1
            for start in range(0, len(images), step):
                self._on_batch(min(step, len(images) - start))
        return Prediction(self.info().version if version is None else int(version), outputs)

    def run(self, signature_name, inputs, version=None, deadline=None):
        """One TF Serving call per ``max_batch`` rows, all by ``deadline``; the outputs concatenated in order."""
        chunks = _split(inputs, self.max_batch)
        if len(chunks) == 1:
            return self._run_once(signature_name, chunks[0], version, self._budget(deadline))
        parts = [self._run_once(signature_name, chunk, version, self._budget(deadline)) for chunk in chunks]
        outputs = {}
        for key in parts[0]:
            arrays = [np.asarray(part[key]) for part in parts]
            if any(a.ndim == 0 for a in arrays):
                raise BadRequest(f"output {key!r} has no batch dimension; send at most {self.max_batch} rows")
            outputs[key] = np.concatenate(arrays)
        return outputs

    def ready(self):
        info = self.info()
        outputs = self.run(SIGNATURE_PIXELS, {INPUT_PIXELS: readiness_images()})
        if np.asarray(outputs[OUTPUT_PROBABILITIES]).shape[0] != 1:
            raise Unavailable("the probe prediction returned the wrong batch size")
        return info.version

    def _budget(self, deadline):
        """``(seconds, late)`` for one call: ``TFSERVING_TIMEOUT_S``, or less when the request's deadline comes first, and
        the error to raise when they pass (the request's own ``Shed("timeout")``, else TF Serving's 503)."""
        seconds = self.timeout_s
        if deadline is not None and deadline - time.monotonic() < seconds:
            return max(0.001, deadline - time.monotonic()), Shed("the request's deadline passed while TF Serving answered",
                                                                 "timeout")
        return seconds, Unavailable(f"TF Serving at {self._address} did not answer within {self.timeout_s:g} s")

    def _output_dtypes(self, signature_name):
        try:
            signature = self.info().signatures.get(signature_name)
        except ServeError:
            signature = None
        dtypes = {key: spec.numpy for key, spec in signature.outputs.items()} if signature is not None else {}
        dtypes.setdefault(OUTPUT_PROBABILITIES, np.float32)
        dtypes.setdefault(OUTPUT_CLASS_IDS, np.int64)
        dtypes.setdefault(OUTPUT_CLASS_NAMES, object)
        return dtypes

    def close(self):
        pass


class TFServingRestBackend(_RemoteBackend):
    """TF Serving's REST API at ``url`` (``http://host:8501``), through one ``requests.Session``."""

    kind = "tfserving-rest"

    def __init__(self, url, name, timeout_s, model_dir=None, on_batch=None, *, max_batch):
        import requests

        super().__init__(name, timeout_s, model_dir, on_batch, max_batch=max_batch)
        self.url = self._address = url.rstrip("/")
        self._session = requests.Session()

    def _request(self, method, path, body=None, budget=None):
        url = f"{self.url}/v1/models/{self.name}{path}"
        seconds, late = budget or self._budget(None)
        deadline = time.monotonic() + seconds
        with tracing.span(f"tfserving {method}", {"http.request.method": method, "url.full": url}, tracing.CLIENT):
            return self._request_once(method, url, body, deadline, late)

    def _request_once(self, method, url, body, deadline, late):
        import requests

        headers = tracing.inject({})
        for attempt in (1, 2):
            try:
                response = self._session.request(method, url, json=body, timeout=max(0.001, deadline - time.monotonic()),
                                                 stream=True, headers=headers)
                break
            except requests.Timeout:
                raise late from None
            except requests.ConnectionError as e:
                # A pooled connection may be stale after TF Serving restarted: retry once on a fresh one.
                if attempt == 2 or time.monotonic() >= deadline:
                    raise Unavailable(f"TF Serving at {self.url} is unreachable ({type(e).__name__})") from None
        with response:
            data = _read_body(response, deadline, late, self.url)
        try:
            payload = json.loads(data)
        except ValueError:
            payload = None
        if response.status_code >= 400:
            error = payload.get("error") if isinstance(payload, dict) else data[:200].decode("utf-8", "replace")
            kind = {400: BadRequest, 404: NotFound}.get(response.status_code, Unavailable)
            raise kind(f"TF Serving: {error or response.reason}")
        if not isinstance(payload, dict):
            raise Unavailable(f"TF Serving at {self.url} answered {response.status_code} with a body that is not a JSON "
                              "object")
        return payload

    def _fetch_metadata(self):
        status = self._request("GET", "")
        meta = self._request("GET", "/metadata")
        try:
            versions = [int(v["version"]) for v in status.get("model_version_status", []) if v.get("state") == "AVAILABLE"]
            defs = meta.get("metadata", {}).get("signature_def", {}).get("signature_def", {})
            return signatures.of_json(defs), versions
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise Unavailable(f"TF Serving at {self.url} answered a status or metadata this server cannot read "
                              f"({type(e).__name__})") from None

    def _run_once(self, signature_name, inputs, version=None, budget=None):
        body = {"signature_name": signature_name, "inputs": {k: _to_json(v) for k, v in inputs.items()}}
        path = f"/versions/{int(version)}:predict" if version is not None else ":predict"
        payload = self._request("POST", path, body, budget)
        if "outputs" not in payload:
            raise Unavailable(f"TF Serving at {self.url} answered without \"outputs\"")
        outputs = payload["outputs"]
        dtypes = self._output_dtypes(signature_name)
        if not isinstance(outputs, dict):  # a single-output signature comes back bare
            signature = self.info().signatures.get(signature_name)
            declared = list(signature.outputs) if signature is not None else []
            if len(declared) != 1:
                raise Unavailable(f"TF Serving at {self.url} answered one bare output for signature {signature_name!r}, "
                                  f"which has {len(declared)}")
            outputs = {declared[0]: outputs}
        try:
            return {key: _from_json(value, dtypes.get(key)) for key, value in outputs.items()}
        except (TypeError, ValueError) as e:
            raise Unavailable(f"TF Serving at {self.url} answered outputs that are not tensors ({e})") from None


def _read_body(response, deadline, late, url):
    """The whole body of ``response``, read by ``deadline`` and at most :data:`MAX_ANSWER_BYTES` long.

    requests' timeout bounds each socket read, not the answer: a server that sends a byte every
    second would hold the thread for as long as it liked. A timer shuts the socket at the
    deadline, which ends a read that is waiting.
    """
    import requests

    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise Unavailable(f"TF Serving at {url} answered {declared} bytes; at most {MAX_ANSWER_BYTES} are read")
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _shut, args=(response.raw,))
    watchdog.daemon = True
    watchdog.start()
    chunks, size = [], 0
    try:
        for chunk in response.iter_content(65536):
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise Unavailable(f"TF Serving at {url} answered more than {MAX_ANSWER_BYTES} bytes")
            chunks.append(chunk)
            if time.monotonic() >= deadline:
                raise late
    except (requests.RequestException, OSError, ValueError):
        if time.monotonic() >= deadline:
            raise late from None
        raise Unavailable(f"TF Serving at {url} broke off its answer") from None
    finally:
        watchdog.cancel()
    return b"".join(chunks)


def _shut(raw):
    """End a read of ``raw`` (urllib3's response) that is waiting: its socket is shut for reading."""
    try:
        raw.shutdown()
    except (AttributeError, OSError, RuntimeError, ValueError):  # nosec B110  # released, closed, or an urllib3 before 2.3
        pass


def _split(inputs, max_batch):
    """``inputs`` as a list of dicts of at most ``max_batch`` rows each (one dict when it fits).

    Only inputs that all share their first dimension are split: anything else goes as it came,
    and TF Serving says what is wrong with it.
    """
    sizes = {np.shape(value)[0] if np.ndim(value) else None for value in inputs.values()}
    if not max_batch or len(sizes) != 1 or None in sizes or next(iter(sizes)) <= max_batch:
        return [inputs]
    (rows,) = sizes
    return [{key: value[start : start + max_batch] for key, value in inputs.items()} for start in range(0, rows, max_batch)]


def _to_json(array):
    if array.dtype == object:
        return _b64_tree(array.tolist())
    return array.tolist()


def _b64_tree(value):
    import base64

    if isinstance(value, list):
        return [_b64_tree(v) for v in value]
    if isinstance(value, str):
        value = value.encode()
    return {"b64": base64.b64encode(value).decode("ascii")}


def _from_json(value, dtype):
    if dtype is object:
        return np.array(_bytes_tree(value), dtype=object)
    return np.asarray(value, dtype=dtype)


def _bytes_tree(value):
    import base64

    if isinstance(value, list):
        return [_bytes_tree(v) for v in value]
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    return value.encode() if isinstance(value, str) else value


class TFServingGrpcBackend(_RemoteBackend):
    """TF Serving's gRPC ``PredictionService`` at ``target`` (``host:8500``): one channel, deadlines."""

    kind = "tfserving-grpc"

    def __init__(self, target, name, timeout_s, model_dir=None, on_batch=None, *, max_batch):
        import grpc
        from tfs_protos.tensorflow_serving.apis import prediction_service_pb2_grpc

        super().__init__(name, timeout_s, model_dir, on_batch, max_batch=max_batch)
        self.target = self._address = target
        # Short reconnect back-off, so the server notices a restarted TF Serving quickly.
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.min_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 1000),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ],
        )
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)

    def _call(self, method, request, budget=None):
        import grpc

        seconds, late = budget or self._budget(None)
        try:
            with tracing.span(f"tfserving {method}", {"rpc.system": "grpc", "rpc.method": method}, tracing.CLIENT):
                return getattr(self._stub, method)(request, timeout=seconds,
                                                   metadata=tuple(tracing.inject({}).items()) or None)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = e.details() if hasattr(e, "details") else str(e)
            if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                raise BadRequest(f"TF Serving: {details}") from None
            if code == grpc.StatusCode.NOT_FOUND:
                raise NotFound(f"TF Serving: {details}") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise late from None
            name = code.name if code is not None else "error"
            raise Unavailable(f"TF Serving at {self.target} is unavailable ({name}: {details})") from None

    def _fetch_metadata(self):
        from tfs_protos.tensorflow.core.protobuf import meta_graph_pb2  # noqa: F401  (SignatureDef, for Unpack)
        from tfs_protos.tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest()
        request.model_spec.name = self.name
        request.metadata_field.append("signature_def")
        response = self._call("GetModelMetadata", request)
        defs = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(defs)
        version = response.model_spec.version.value
        return signatures.of_signature_defs(defs.signature_def), ([version] if version else [])

    def _run_once(self, signature_name, inputs, version=None, budget=None):
        from tfs_protos.tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        request.model_spec.name = self.name
        request.model_spec.signature_name = signature_name
        if version is not None:
            request.model_spec.version.value = int(version)
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(tensors.to_proto(value))
        response = self._call("Predict", request, budget)
        return {key: tensors.to_array(tensor) for key, tensor in response.outputs.items()}

    def close(self):
        self._channel.close()
