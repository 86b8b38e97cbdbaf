"""Prediction backends: one small interface, three implementations.

* ``LocalBackend`` - the exported model in this process, run by one of :mod:`serve.runtimes`
  (LiteRT float32 or int8, or the SavedModel in TensorFlow), with concurrent requests
  micro-batched.
* ``TFServingRestBackend`` - a TF Serving REST endpoint.
* ``TFServingGrpcBackend`` - a TF Serving gRPC ``PredictionService``.

Every backend offers:

* ``predict(images)``: uint8 ``[N, 32, 32, 3]`` -> ``{output key: array [N, ...]}``
  through the ``serving_default`` signature;
* ``run(signature_name, inputs, version=None)``: any signature, ``{input key: array}``
  (strings as ``object`` arrays of ``bytes``) -> ``{output key: array}``;
* ``ready()``: raises :class:`BackendError` unless a probe prediction succeeds;
* ``metadata()``: ``name``, ``version``, ``versions``, ``architecture``, ``class_names``,
  ``signature_defs`` (TF Serving's JSON form); the local backend adds ``runtime``.

Failures raise :class:`BackendError` with the HTTP status to answer with.
"""

import logging
import os
import threading
import time

import numpy as np

from contract import (
    CHANNELS,
    IMAGE_SIZE,
    INPUT_PIXELS,
    OUTPUT_CLASS_IDS,
    OUTPUT_CLASS_NAMES,
    OUTPUT_PROBABILITIES,
    SIGNATURE_PIXELS,
)
from serve import runtimes, settings, signatures, tensors

RELOAD_INTERVAL_S = 5.0  # how often a backend that failed to load tries again
RETIRE_AFTER_S = 30.0  # how long a replaced version keeps answering requests already sent to it
METADATA_TTL_S = 30.0  # how long a TF Serving backend trusts the metadata it fetched


class BackendError(Exception):
    """A prediction that failed; ``status`` is the HTTP code (503: try again later)."""

    def __init__(self, message, status=503):
        super().__init__(message)
        self.status = status


def probe_batch():
    return np.zeros((1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS), np.uint8)


def _model_facts(manifest):
    model = manifest.get("model") or {}
    names = manifest.get("class_names")
    return (model.get("name") if isinstance(model, dict) else None), (list(names) if names else None)


class LocalBackend:
    """The highest version under ``model_dir`` in one of :mod:`serve.runtimes`, batched by a :class:`serve.batcher.Batcher`.

    ``on_load(runtime, version)`` is called each time a version starts answering.
    """

    kind = "local"

    def __init__(self, model_dir, name, max_batch=32, batch_wait_ms=2.0, on_batch=None, poll_s=30.0,
                 runtime=runtimes.DEFAULT_RUNTIME, threads=None, on_load=None):
        self.model_dir = str(model_dir)
        self.name = name
        self.runtime = runtimes.check(runtime)
        self._threads = threads or None  # None: runtimes.default_threads()
        self._on_load = on_load
        self._skipped = set()  # newer versions without this runtime's model, already logged
        # Like TF Serving's file-system poll: a new version N+1/ replaces the served one.
        self._poll_s = float(poll_s)
        self._polled_at = time.monotonic()
        self._swapping = threading.Lock()
        self._max_batch = max_batch
        self._wait_s = batch_wait_ms / 1000.0
        self._on_batch = on_batch
        self._lock = threading.Lock()
        self._state = None  # dict once loaded
        self._error = None
        self._tried_at = None
        # Load in the background: the worker answers /healthz and /readyz (503) meanwhile
        # instead of leaving connections hanging while the model loads.
        self._loader = threading.Thread(target=self._load_quietly, name="model-loader", daemon=True)
        self._loader.start()

    def wait_loaded(self, timeout=None):
        """Block until the first load attempt has finished (for tests and tools)."""
        self._loader.join(timeout)

    def _load_quietly(self):
        try:
            self._load()
        except BackendError:
            pass  # kept in self._error; readyz reports it

    # -- loading -----------------------------------------------------------------------
    def _load(self, wait=True):
        if self._state is not None:
            self._poll_versions()
            return self._state
        if not self._lock.acquire(blocking=wait):
            raise BackendError(f"the model in {self.model_dir} is still loading")
        try:
            if self._state is not None:
                return self._state
            if self._tried_at is not None and time.monotonic() - self._tried_at < RELOAD_INTERVAL_S:
                raise BackendError(self._error)
            self._tried_at = time.monotonic()
            try:
                self._state = self._load_unlocked()
                self._error = None
                self._loaded(self._state)
                return self._state
            except BackendError as e:
                self._error = str(e)
            except Exception as e:  # a broken SavedModel must not take the worker down
                self._error = f"cannot load the model from {self.model_dir}: {type(e).__name__}: {e}"
            raise BackendError(self._error)
        finally:
            self._lock.release()

    def _poll_versions(self):
        """Start loading a newer version in the background when one has appeared (at most every poll_s)."""
        now = time.monotonic()
        if self._poll_s <= 0 or now - self._polled_at < self._poll_s:
            return
        self._polled_at = now
        available = runtimes.versions(self.model_dir, self.runtime)
        newest = signatures.versions(self.model_dir)
        if newest and newest[-1] > self._state["version"] and newest[-1] not in available and newest[-1] not in self._skipped:
            self._skipped.add(newest[-1])
            reason = runtimes.missing_reason(os.path.join(self.model_dir, str(newest[-1])), self.runtime)
            logging.getLogger(__name__).warning("not switching to version %s: %s", newest[-1], reason)
        if available and available[-1] > self._state["version"] and self._swapping.acquire(blocking=False):
            threading.Thread(target=self._swap, args=(available[-1],), name="model-swap", daemon=True).start()

    def _swap(self, version):
        try:
            new_state = self._load_unlocked(version)
        except Exception as e:  # keep serving the version we have; try again at the next poll
            logging.getLogger(__name__).warning("not switching to version %s: %s", version, e)
            return
        finally:
            self._swapping.release()
        old_state, self._state = self._state, new_state
        self._loaded(new_state)
        logging.getLogger(__name__).info("now serving version %s (was %s)", version, old_state["version"])
        # Requests that already hold the old state finish on it; then its batcher thread ends.
        retire = threading.Timer(RETIRE_AFTER_S, old_state["batcher"].close)
        retire.daemon = True  # never hold up a worker's shutdown
        retire.start()

    def _load_unlocked(self, version=None):
        available = runtimes.versions(self.model_dir, self.runtime)
        if not available:
            saved = signatures.versions(self.model_dir)
            if saved:  # versions there are, but none this runtime can serve: say why
                raise BackendError(runtimes.missing_reason(os.path.join(self.model_dir, str(saved[-1])), self.runtime))
            raise BackendError(f"no model versions (directories N/ with a saved_model.pb) under {self.model_dir}")
        version = version or available[-1]
        path = os.path.join(self.model_dir, str(version))
        model = runtimes.load(self.runtime, path, self._threads)
        architecture, class_names = _model_facts(signatures.read_manifest(path))
        batcher = _make_batcher(model.pixels, self._max_batch, self._wait_s, self._on_batch)
        return {
            "version": version,
            "model": model,
            "batcher": batcher,
            "signature_defs": model.signature_defs,
            "architecture": architecture,
            "class_names": class_names,
        }

    def _loaded(self, state):
        if self._on_load is not None:
            try:
                self._on_load(self.runtime, state["version"])
            except Exception:  # metrics must never stop a model from serving
                logging.getLogger(__name__).exception("on_load hook failed")

    @property
    def batch_sizes(self):
        """How many batches of each size the model ran (empty until loaded)."""
        return self._state["batcher"].batch_sizes if self._state else {}

    # -- the interface -----------------------------------------------------------------
    def predict(self, images):
        state = self._load()
        try:
            return state["batcher"].submit(images)
        except Exception as e:
            raise BackendError(f"prediction failed: {type(e).__name__}: {e}", 500) from e

    def run(self, signature_name, inputs, version=None):
        state = self._load()
        self._check_version(state, version)
        if signature_name not in state["signature_defs"]:
            raise BackendError(f"signature {signature_name!r} not found; this model has {sorted(state['signature_defs'])}", 400)
        try:
            signatures.check_inputs(signature_name, state["signature_defs"][signature_name], inputs)
        except ValueError as e:
            raise BackendError(str(e), 400) from None
        try:
            return state["model"].call(signature_name, inputs, self.predict)
        except runtimes.InputError as e:
            raise BackendError(str(e), 400) from None

    def ready(self):
        state = self._load(wait=False)
        outputs = self.predict(probe_batch())
        if outputs[OUTPUT_PROBABILITIES].shape[0] != 1:
            raise BackendError("the probe prediction returned the wrong batch size")
        return state["version"]

    def metadata(self):
        state = self._load()
        return {
            "name": self.name,
            "version": state["version"],
            "versions": [state["version"]],
            "architecture": state["architecture"],
            "class_names": state["class_names"],
            "signature_defs": state["signature_defs"],
            "runtime": self.runtime,
        }

    def close(self):
        if self._state:
            self._state["batcher"].close()

    def _check_version(self, state, version):
        if version is not None and int(version) != state["version"]:
            raise BackendError(f"model {self.name!r} version {version} is not loaded (serving {state['version']})", 404)


def _make_batcher(fn, max_batch, wait_s, on_batch):
    from serve.batcher import Batcher

    return Batcher(fn, max_batch=max_batch, max_wait_s=wait_s, on_batch=on_batch)


class _RemoteBackend:
    """What the two TF Serving backends share: cached metadata, the manifest, the probe, and
    requests split into batches of at most ``max_batch`` rows (0: never split).

    TF Serving with ``--enable_batching`` refuses a request larger than its ``max_batch_size``
    (``deploy/batching.config``: 128) with INVALID_ARGUMENT, so a bigger request is sent as
    several, one after the other, and the answers are put back together in order.
    """

    def __init__(self, name, timeout_s, model_dir=None, on_batch=None, max_batch=settings.DEFAULT_TFSERVING_MAX_BATCH):
        self.name = name
        self.timeout_s = float(timeout_s)
        self.max_batch = int(max_batch or 0)
        self._on_batch = on_batch
        self._meta = None
        self._meta_at = 0.0
        self._lock = threading.Lock()
        # TF Serving does not expose assets.extra; read the manifest where the files are at hand.
        self._architecture, self._class_names = None, None
        if model_dir:
            available = signatures.versions(model_dir)
            if available:
                manifest = signatures.read_manifest(os.path.join(str(model_dir), str(available[-1])))
                self._architecture, self._class_names = _model_facts(manifest)

    def metadata(self):
        with self._lock:
            if self._meta is not None and time.monotonic() - self._meta_at < METADATA_TTL_S:
                return self._meta
        signature_defs, versions = self._fetch_metadata()
        meta = {
            "name": self.name,
            "version": max(versions) if versions else None,
            "versions": sorted(versions),
            "architecture": self._architecture,
            "class_names": self._class_names,
            "signature_defs": signature_defs,
        }
        with self._lock:
            self._meta, self._meta_at = meta, time.monotonic()
        return meta

    def predict(self, images):
        outputs = self.run(SIGNATURE_PIXELS, {INPUT_PIXELS: images})
        if self._on_batch is not None:
            step = self.max_batch or len(images) or 1
            for start in range(0, len(images), step):
                self._on_batch(min(step, len(images) - start))
        return outputs

    def run(self, signature_name, inputs, version=None):
        """One TF Serving call per ``max_batch`` rows; the outputs concatenated in order."""
        chunks = _split(inputs, self.max_batch)
        if len(chunks) == 1:
            return self._run_once(signature_name, chunks[0], version)
        parts = [self._run_once(signature_name, chunk, version) for chunk in chunks]
        outputs = {}
        for key in parts[0]:
            arrays = [np.asarray(part[key]) for part in parts]
            if any(a.ndim == 0 for a in arrays):
                raise BackendError(f"output {key!r} has no batch dimension; send at most {self.max_batch} rows", 400)
            outputs[key] = np.concatenate(arrays)
        return outputs

    def ready(self):
        meta = self.metadata()
        outputs = self.run(SIGNATURE_PIXELS, {INPUT_PIXELS: probe_batch()})
        if np.asarray(outputs[OUTPUT_PROBABILITIES]).shape[0] != 1:
            raise BackendError("the probe prediction returned the wrong batch size")
        return meta["version"]

    def _output_dtypes(self, signature_name):
        try:
            sig = self.metadata()["signature_defs"].get(signature_name, {})
        except BackendError:
            sig = {}
        dtypes = signatures.output_dtypes(sig)
        dtypes.setdefault(OUTPUT_PROBABILITIES, np.float32)
        dtypes.setdefault(OUTPUT_CLASS_IDS, np.int64)
        dtypes.setdefault(OUTPUT_CLASS_NAMES, object)
        return dtypes

    def close(self):
        pass


class TFServingRestBackend(_RemoteBackend):
    """TF Serving's REST API at ``url`` (``http://host:8501``), through one ``requests.Session``."""

    kind = "tfserving-rest"

    def __init__(self, url, name, timeout_s=5.0, model_dir=None, on_batch=None, max_batch=settings.DEFAULT_TFSERVING_MAX_BATCH):
        import requests

        super().__init__(name, timeout_s, model_dir, on_batch, max_batch)
        self.url = url.rstrip("/")
        self._session = requests.Session()

    def _request(self, method, path, body=None):
        import requests

        url = f"{self.url}/v1/models/{self.name}{path}"
        for attempt in (1, 2):
            try:
                response = self._session.request(method, url, json=body, timeout=self.timeout_s)
                break
            except requests.Timeout:
                raise BackendError(f"TF Serving at {self.url} did not answer within {self.timeout_s:g} s") from None
            except requests.ConnectionError as e:
                # A pooled connection may be stale after TF Serving restarted: retry once on a fresh one.
                if attempt == 2:
                    raise BackendError(f"TF Serving at {self.url} is unreachable ({type(e).__name__})") from None
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": response.text[:200]}
        if response.status_code >= 400:
            status = response.status_code if response.status_code in (400, 404) else 503
            raise BackendError(f"TF Serving: {payload.get('error', response.reason)}", status)
        return payload

    def _fetch_metadata(self):
        status = self._request("GET", "")
        versions = [
            int(v["version"]) for v in status.get("model_version_status", []) if v.get("state") == "AVAILABLE"
        ]
        meta = self._request("GET", "/metadata")
        defs = meta.get("metadata", {}).get("signature_def", {}).get("signature_def", {})
        return {k: v for k, v in defs.items() if k != signatures.INIT_OP}, versions

    def _run_once(self, signature_name, inputs, version=None):
        body = {"signature_name": signature_name, "inputs": {k: _to_json(v) for k, v in inputs.items()}}
        path = f"/versions/{int(version)}:predict" if version is not None else ":predict"
        payload = self._request("POST", path, body)
        outputs = payload.get("outputs")
        dtypes = self._output_dtypes(signature_name)
        if not isinstance(outputs, dict):  # a single-output signature comes back bare
            (only,) = dtypes or (OUTPUT_PROBABILITIES,)
            outputs = {only: outputs}
        return {key: _from_json(value, dtypes.get(key)) for key, value in outputs.items()}


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

    def __init__(self, target, name, timeout_s=5.0, model_dir=None, on_batch=None, max_batch=settings.DEFAULT_TFSERVING_MAX_BATCH):
        import grpc
        from client.protos.tensorflow_serving.apis import prediction_service_pb2_grpc

        super().__init__(name, timeout_s, model_dir, on_batch, max_batch)
        self.target = target
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

    def _call(self, method, request):
        import grpc

        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = e.details() if hasattr(e, "details") else str(e)
            if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                raise BackendError(f"TF Serving: {details}", 400) from None
            if code == grpc.StatusCode.NOT_FOUND:
                raise BackendError(f"TF Serving: {details}", 404) from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise BackendError(f"TF Serving at {self.target} did not answer within {self.timeout_s:g} s") from None
            name = code.name if code is not None else "error"
            raise BackendError(f"TF Serving at {self.target} is unavailable ({name}: {details})") from None

    def _fetch_metadata(self):
        from client.protos.tensorflow.core.protobuf import meta_graph_pb2  # noqa: F401  (SignatureDef, for Unpack)
        from client.protos.tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest()
        request.model_spec.name = self.name
        request.metadata_field.append("signature_def")
        response = self._call("GetModelMetadata", request)
        defs = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(defs)
        version = response.model_spec.version.value
        return signatures.signature_def_map_json(defs), ([version] if version else [])

    def _run_once(self, signature_name, inputs, version=None):
        from client.protos.tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        request.model_spec.name = self.name
        request.model_spec.signature_name = signature_name
        if version is not None:
            request.model_spec.version.value = int(version)
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(tensors.to_proto(value))
        response = self._call("Predict", request)
        return {key: tensors.to_array(tensor) for key, tensor in response.outputs.items()}

    def close(self):
        self._channel.close()


def from_config(config, on_batch=None, on_load=None):
    """The backend ``config["BACKEND"]`` names, built from the app's configuration."""
    kind = config["BACKEND"]
    if kind == "local":
        return LocalBackend(
            config["MODEL_DIR"], config["MODEL_NAME"], config["MAX_BATCH"], config["BATCH_WAIT_MS"], on_batch,
            poll_s=config.get("MODEL_POLL_S", settings.DEFAULT_MODEL_POLL_S),
            runtime=config.get("RUNTIME") or runtimes.DEFAULT_RUNTIME,
            threads=config.get("RUNTIME_THREADS") or None,
            on_load=on_load,
        )
    if kind == "tfserving-rest":
        if not config.get("TFSERVING_REST_URL"):
            raise ValueError("SERVE_BACKEND=tfserving-rest needs TFSERVING_REST_URL")
        return TFServingRestBackend(
            config["TFSERVING_REST_URL"], config["MODEL_NAME"], config["TFSERVING_TIMEOUT_S"], config["MODEL_DIR"], on_batch,
            max_batch=config.get("TFSERVING_MAX_BATCH", settings.DEFAULT_TFSERVING_MAX_BATCH),
        )
    if kind == "tfserving-grpc":
        if not config.get("TFSERVING_GRPC_TARGET"):
            raise ValueError("SERVE_BACKEND=tfserving-grpc needs TFSERVING_GRPC_TARGET")
        return TFServingGrpcBackend(
            config["TFSERVING_GRPC_TARGET"], config["MODEL_NAME"], config["TFSERVING_TIMEOUT_S"], config["MODEL_DIR"], on_batch,
            max_batch=config.get("TFSERVING_MAX_BATCH", settings.DEFAULT_TFSERVING_MAX_BATCH),
        )
    raise ValueError(f"unknown backend {kind!r}; choose local, tfserving-rest or tfserving-grpc")
