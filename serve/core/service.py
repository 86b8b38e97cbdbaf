"""The inference service: one request type in, one answer out, and everything the protocols share, written once.

Every protocol module (:mod:`serve.protocols`) turns its wire format into an
:class:`~serve.core.request.InferRequest` and hands it to :meth:`InferenceService.infer`, which owns,
for every protocol alike and in this order:

* **the deadline**: the caller's own (gRPC's, HTTP's ``X-Request-Timeout``), capped by
  ``SERVE_PREDICT_TIMEOUT_S``, which is also the deadline of a caller who gives none;
* **version routing**: which model name, version or label answers (:meth:`model`);
* **the signature**: it exists, its inputs are named, the outputs asked for are its own;
* **load shedding**: a worker with ``SERVE_MAX_QUEUE`` images already in hand refuses more at once;
* **every input check**, by :mod:`serve.core.tensors`: the image cap, declared sizes, types, ranges, shapes;
* **decoding**: encoded images become pixels here, by :mod:`serve.core.decode` alone, within the pixel
  cap and the request's pixel budget (a ``serve.decode`` span when traces are on);
* **prediction**: the backend's :meth:`~serve.core.model.Backend.infer` by the deadline (the local backend
  batches concurrent calls), whose answer names the version that gave it;
* **ranking, labels and confidence** (:class:`~serve.core.request.InferResponse`), **readiness**
  (:meth:`ready`: a probe prediction at most once a second), and **the metrics of the answers**: images
  classified, top probabilities, scores, verdicts, each counted exactly once per image whichever route it came by.

Who may call at all (keys, rate limits) is :mod:`serve.core.admission`'s, asked before the request is read.

Typical usage (``create_app`` builds one per app)::

    service = InferenceService(backend, "cifar10", Limits(max_images=256, max_pixels=4096 * 4096, top_k=3, ...))
    answer = service.infer(InferRequest({"image_bytes": Tensor([Upload("cat.png", data)])},
                                        signature="predict_images", per_image=True))
    answer.images[0].label
"""

import dataclasses
import threading
import time

import numpy as np

from contract import CHANNELS, IMAGE_SIZE, INPUT_BYTES, INPUT_PIXELS, OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES, SIGNATURE_BYTES, SIGNATURE_PIXELS
from serve.core import decode as decoder
from serve.core import tensors
from serve.core.errors import (BadRequest, DeadlineExceeded, ModelFailed, NotServed, ServeError, Shed, TooLarge,
                               Unavailable, echo)
from serve.core.model import Backend, ModelInfo
from serve.core.request import Answered, InferRequest, InferResponse, Refused, Upload, float32_list, ranked
from serve.telemetry import tracing

_PIXELS = (IMAGE_SIZE, IMAGE_SIZE, CHANNELS)
#: Seconds a readiness probe's result stands for: no number of probes drives more than one model call a second.
PROBE_INTERVAL_S = 1.0


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask of this worker (built by :meth:`serve.settings.Settings.limits`)."""

    max_images: int  # images in one request (SERVE_MAX_IMAGES)
    max_pixels: int  # pixels one image may declare (SERVE_MAX_PIXELS)
    top_k: int  # classes ranked when the request does not say (SERVE_TOP_K)
    max_request_pixels: int  # pixels all the images of one request may declare (SERVE_MAX_REQUEST_PIXELS)
    max_tensor_bytes: int = 64 << 20  # bytes one input may declare: what one request may carry (SERVE_MAX_UPLOAD_MB)
    decode_concurrency: int = 1  # requests of this process decoding at once (SERVE_DECODE_CONCURRENCY)
    max_queue: int | None = None  # images this worker holds at once before it sheds (SERVE_MAX_QUEUE)
    timeout_s: float = 30.0  # the longest a request may take, and the deadline of one that names none (SERVE_PREDICT_TIMEOUT_S)


class InferenceService:
    """One model name over one :class:`~serve.core.model.Backend`, with the limits and metrics every protocol shares."""

    def __init__(self, backend: Backend, model_name: str, limits: Limits, metrics=None, on_answer=None,
                 clock=time.monotonic):
        self.backend = backend
        self.model_name = model_name
        self.limits = limits
        self._metrics = metrics
        self._on_answer = on_answer  # on_answer(version, images): e.g. the request's log line (serve.telemetry.logs)
        self._clock = clock
        self._decoding = threading.BoundedSemaphore(max(1, limits.decode_concurrency))
        self._holding = 0  # images admitted and not yet answered, over every request of this worker
        self._counting = threading.Lock()
        self._probe_lock = threading.Lock()
        self._probed_at = self._probe_result = None

    @property
    def kind(self):
        return self.backend.kind

    # -- the model, its versions and its readiness ---------------------------------------
    def info(self) -> ModelInfo:
        return self.backend.info()

    def model(self, name=None, version=None, label=None) -> ModelInfo:
        """The info of the version a request names, once ``name`` (None: this server's) serves it.

        ``version`` (a number) or ``label`` (a version label of the model config) names the version;
        neither, the newest. The info's ``version`` is the number a label resolves to. Raises
        :class:`NotServed` (a 404), which each protocol words its own way.
        """
        if name is not None and name != self.model_name:
            raise NotServed(f"unknown model {echo(name)}; this server serves {self.model_name!r}", name=name,
                            version=version)
        info = self.backend.info()
        if label is not None:
            if version is not None:
                raise BadRequest(f"name a version ({echo(version)}) or a label ({echo(label)}), not both")
            if label not in info.labels:
                known = ", ".join(sorted(info.labels)) or "none"
                raise NotServed(f"model {self.model_name!r} has no version label {echo(label)} (labels: {known})",
                                name=name or self.model_name, label=label, versions=info.versions)
            version = info.labels[label]
        if version is None:
            return info
        number = _version_number(version)
        if number is None or number not in info.versions:
            shown = version if isinstance(version, int) else echo(version)
            raise NotServed(f"model {self.model_name!r} has no version {shown} "
                            f"(available: {', '.join(str(v) for v in info.versions)})", name=name or self.model_name,
                            version=version, versions=info.versions)
        return info if number == info.version else self.backend.info(number)

    def ready(self):
        """The served version once a probe prediction succeeded, run at most once every :data:`PROBE_INTERVAL_S`
        seconds (every other caller gets its result); :class:`Unavailable` with the reason otherwise."""
        if not self.backend.loaded:
            # Still loading: the answer costs no model call, and must turn the moment the model is in.
            return _unwrap(self._probe())
        with self._probe_lock:  # one probe at a time; the others wait for its result
            now = self._clock()
            if self._probed_at is None or now - self._probed_at >= PROBE_INTERVAL_S:
                self._probe_result = self._probe()
                self._probed_at = self._clock()
            result = self._probe_result
        return _unwrap(result)

    def _probe(self):
        try:
            return self.backend.ready()
        except ServeError as e:
            return Unavailable(str(e))
        except Exception as e:  # the probe itself failing means "not ready", never a 500
            return Unavailable(f"probe failed: {type(e).__name__}: {e}")

    # -- the request ---------------------------------------------------------------------
    def infer(self, request: InferRequest) -> InferResponse:
        """Answer ``request``, or raise the one :class:`~serve.core.errors.ServeError` kind that says why not."""
        deadline, caller_binds = self._deadline(request.deadline)
        info = self.model(request.model_name, request.version, request.label)
        version = info.version if request.version is not None or request.label is not None else None
        signature = info.signature(request.signature)
        if signature is None:
            raise BadRequest(f"signature {echo(request.signature)} not found; this model has {sorted(info.signatures)}")
        inputs = _named(request.inputs, signature, request.signature)
        wanted = _wanted(request.outputs, signature)
        k = self.limits.top_k if request.top_k is None else request.top_k
        if k < 1:
            raise BadRequest(f"top_k must be at least 1, got {k}")
        count = min(max((tensors.count_of(tensor) or 0 for tensor in inputs.values()), default=0), self.limits.max_images)
        self._hold(count)
        try:
            arrays = {key: tensors.read(key, tensor, signature.inputs[key], self.limits, request.dtype_names)
                      for key, tensor in inputs.items()}
            if request.signature == SIGNATURE_BYTES and list(arrays) == [INPUT_BYTES]:
                return self._encoded(info, arrays[INPUT_BYTES], request, version, wanted, k, deadline, caller_binds)
            if request.signature == SIGNATURE_PIXELS and list(arrays) == [INPUT_PIXELS]:
                outputs, answered_by = self._predict(info, arrays[INPUT_PIXELS], version, deadline, caller_binds)
            else:
                outputs = self.backend.run(request.signature, arrays, version)
                answered_by = info.version if version is None else version
                if OUTPUT_PROBABILITIES in outputs:
                    self._observe(answered_by, outputs, len(np.asarray(outputs[OUTPUT_PROBABILITIES])))
        finally:
            self._release(count)
        return InferResponse(info, answered_by, _only(outputs, wanted), k)

    def _encoded(self, info, images, request, version, wanted, k, deadline, caller_binds):
        """Encoded images decoded, then predicted: per image (a bad one refused in its place), or all or nothing."""
        uploads = images if isinstance(images, list) else [Upload(data=data) for data in images.tolist()]
        readable = [upload.data for upload in uploads if upload.error is None]
        self._check_budget(readable)
        with tracing.span("serve.decode", {"serve.images": len(readable)}), self._decoding:
            decoded = iter(decoder.decode_many(readable, self.limits.max_pixels))
        slots, good = [], []
        for index, upload in enumerate(uploads):
            who = _who(upload, index, request.per_image)
            if upload.error is not None:  # the protocol found its encoding unreadable (bad base64)
                result = BadRequest(f"{who}: {upload.error}")
            else:
                result = next(decoded)
                if isinstance(result, ServeError):
                    result = type(result)(f"{who} {result}")
            if isinstance(result, ServeError):
                if not request.per_image:
                    raise result
                slots.append(Refused(upload.filename, result))
                continue
            slots.append(result)
            good.append(index)
        if not good and request.per_image:
            return InferResponse(info, info.version, {}, k, tuple(slots))
        pixels = np.stack([slots[index][0] for index in good]) if good else np.zeros((0, *_PIXELS), np.uint8)
        outputs, answered_by = self._predict(info, pixels, version, deadline, caller_binds)
        if not request.per_image:
            return InferResponse(info, answered_by, _only(outputs, wanted), k)
        best = ranked(info, outputs, k)
        scores, inside = _confidence_of(outputs, len(good))
        for row, index in enumerate(good):
            upload, fmt = uploads[index], slots[index][1]
            slots[index] = Answered(upload.filename, tuple(best[row]), scores[row], inside[row], fmt, upload.data)
        return InferResponse(info, answered_by, _only(outputs, wanted), k, tuple(slots))

    def _check_budget(self, datas):
        """A 413 naming the budget when the images of one request declare more pixels than ``SERVE_MAX_REQUEST_PIXELS``.

        Read from each image's header, before any is decoded: a request of many small files that
        each declare a huge image costs its header reads, not its pixels. An image over the per-image
        cap counts for nothing here: it is refused on its own, undecoded.
        """
        total = 0
        for data in datas:
            declared = decoder.declared_pixels(data)
            total += declared if declared <= self.limits.max_pixels else 0
            if total > self.limits.max_request_pixels:
                raise TooLarge(f"the request's images declare more than {self.limits.max_request_pixels} pixels in all; "
                               "this server decodes at most that many per request (SERVE_MAX_REQUEST_PIXELS)")

    def _predict(self, info, pixels, version, deadline, caller_binds):
        """``serving_default`` by the backend, by ``deadline``; every image counted once in the metrics."""
        if self._clock() >= deadline:
            raise self._late(caller_binds)
        try:
            prediction = self.backend.infer(pixels, version, deadline)
        except Shed as e:
            if e.reason == "timeout":
                raise self._late(caller_binds) from None
            self._count_shed(e.reason)
            raise
        self._observe(prediction.version, prediction.outputs, len(pixels))
        return prediction.outputs, prediction.version

    def _deadline(self, asked):
        """``(deadline, whether the caller's own binds)``: the caller's, capped by ``SERVE_PREDICT_TIMEOUT_S``."""
        now = self._clock()
        cap = now + self.limits.timeout_s
        if asked is None or asked >= cap:
            return cap, False
        if asked <= now:
            raise self._late(True)
        return asked, True

    def _late(self, caller_binds):
        if caller_binds:
            return DeadlineExceeded("the request's deadline passed before it was answered")
        self._count_shed("timeout")
        return Shed(f"the model did not answer within {self.limits.timeout_s:g} s (SERVE_PREDICT_TIMEOUT_S)", "timeout")

    def _hold(self, count):
        """Hold ``count`` images of this worker's ``SERVE_MAX_QUEUE`` while the request is answered; shed it when full."""
        with self._counting:
            limit = self.limits.max_queue
            if limit is not None and self._holding and self._holding + count > limit:
                self._count_shed("queue_full")
                raise Shed(f"{self._holding} images are already waiting for the model; this worker holds at most "
                           f"{limit} (SERVE_MAX_QUEUE)", "queue_full")
            self._holding += count
            self._tell(self._holding)

    def _release(self, count):
        with self._counting:
            self._holding -= count
            self._tell(self._holding)

    @property
    def holding(self):
        """Images admitted and not yet answered."""
        return self._holding

    def _tell(self, holding):
        if self._metrics is not None:
            self._metrics.queued.set(holding)

    def _count_shed(self, reason):
        if self._metrics is not None:
            self._metrics.shed.labels(reason).inc()

    def _observe(self, version, outputs, images):
        if self._metrics is not None and images:
            self._metrics.images.inc(images)
            self._metrics.answers(version, outputs)
        if self._on_answer is not None and images:
            self._on_answer(version, images)


def _version_number(version):
    """A version as a request names it (a number, or its digits), as an int; None when it is not one."""
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    text = str(version)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def _named(inputs, signature, name):
    """``inputs`` by the signature's keys: the unnamed one (key None) is its one input; every key its own."""
    if None in inputs:
        if len(inputs) > 1 or len(signature.inputs) != 1:
            raise BadRequest(f"signature {echo(name)} takes inputs {sorted(signature.inputs)}: name each input")
        return {next(iter(signature.inputs)): inputs[None]}
    if set(inputs) != set(signature.inputs):
        raise BadRequest(f"signature {echo(name)} takes inputs {sorted(signature.inputs)}, got "
                         f"{', '.join(echo(key) for key in sorted(inputs)) or 'none'}")
    return inputs


def _wanted(outputs, signature):
    """The outputs a request names, checked against the signature's (None: all of them)."""
    if outputs is None:
        return None
    unknown = [key for key in outputs if key not in signature.outputs]
    if unknown:
        raise BadRequest(f"unknown output {echo(unknown[0])}: this signature's outputs are {', '.join(sorted(signature.outputs))}")
    if len(set(outputs)) != len(outputs):
        raise BadRequest(f"an output is named more than once: {', '.join(echo(key) for key in outputs)}")
    return tuple(outputs)


def _only(outputs, wanted):
    if wanted is None:
        return outputs
    missing = [key for key in wanted if key not in outputs]
    if missing:
        raise ModelFailed(f"the model did not answer output {missing[0]!r}")
    return {key: outputs[key] for key in wanted}


def _who(upload, index, per_image):
    """How a refusal names an image: its file name, else its place in the request."""
    if upload.filename:
        return repr(upload.filename)
    return f"instance {index}" if per_image else f"input '{INPUT_BYTES}' element {index}"


def _unwrap(result):
    if isinstance(result, ServeError):
        raise result
    return result


def _confidence_of(outputs, rows):
    """Each row's ``ood_score`` (a float) and ``in_distribution`` (a bool), or None where the model has neither.

    The label is answered either way: ``in_distribution: false`` says the image looks like none of
    the classes, and leaves it to the caller what to do with the label.
    """
    scores = float32_list(outputs[OUTPUT_OOD_SCORE]) if OUTPUT_OOD_SCORE in outputs else [None] * rows
    inside = (np.asarray(outputs[OUTPUT_IN_DISTRIBUTION], bool).tolist() if OUTPUT_IN_DISTRIBUTION in outputs
              else [None] * rows)
    return scores, inside
