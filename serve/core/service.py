"""The inference service: everything the protocols share, written once.

Every protocol adapter (:mod:`serve.protocols`) turns its wire format into a call here and the
typed answer (or the one :class:`ServeError`) back into its wire format; nothing here knows Flask
or HTTP. The service owns, for every protocol alike:

* **version routing**: which model name and versions this server answers for (:meth:`model`);
* **limits**: images per request, pixels per image (:class:`Limits`);
* **decoding**: encoded images become pixels here, by :mod:`serve.core.decode` alone (a ``serve.decode``
  span when traces are on, :mod:`serve.tracing`, which covers the wait for a decoding slot too);
* **prediction**: the backend's :meth:`~serve.core.model.Backend.infer` (the local backend batches
  concurrent calls), whose answer names the version that gave it;
* **ranking, labels and confidence**: top-k with the manifest's class names, the out-of-distribution
  score and verdict (:meth:`classify`, :meth:`top_k`);
* **metrics of the answers**: images classified, top probabilities, scores, verdicts, each counted
  exactly once per image whichever route it came by.

Typical usage (``create_app`` builds one per app)::

    service = InferenceService(backend, "cifar10", Limits(max_images=256, max_pixels=4096 * 4096, top_k=3,
                                                          max_request_pixels=4 * 4096 * 4096))
    result = service.classify([Upload("cat.png", data)])
    result.images[0].label
"""

import dataclasses
import threading
from collections.abc import Mapping

import numpy as np

from contract import INPUT_BYTES, INPUT_PIXELS, OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES, SIGNATURE_BYTES, SIGNATURE_PIXELS
from contract.ranking import top_k as rank
from serve import signatures, tracing
from serve.core import decode as decoder
from serve.core.errors import NotServed, ServeError, Shed
from serve.core.model import Backend, ModelInfo


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask of the model (built from :class:`serve.settings.Settings`)."""

    max_images: int  # images in one request (SERVE_MAX_IMAGES)
    max_pixels: int  # pixels one image may declare (SERVE_MAX_PIXELS)
    top_k: int  # classes ranked when the request does not say (SERVE_TOP_K)
    max_request_pixels: int  # pixels all the images of one request may declare (SERVE_MAX_REQUEST_PIXELS)
    decode_concurrency: int = 1  # requests of this process decoding at once (SERVE_DECODE_CONCURRENCY)


@dataclasses.dataclass(frozen=True)
class Upload:
    """One image of a request: its bytes, or ``error``, why the request's encoding of it could not be read."""

    filename: str | None = None
    data: bytes = b""
    error: str | None = None  # e.g. "is not valid base64": the image is answered with a 400


@dataclasses.dataclass(frozen=True)
class Ranked:
    """One class of an image's top k."""

    label: str
    class_id: int
    probability: float

    def public(self):
        """As the JSON API shows it (``dataclasses.asdict`` deep-copies: a tenth of a 64-image answer's time)."""
        return {"label": self.label, "class_id": self.class_id, "probability": self.probability}


@dataclasses.dataclass(frozen=True)
class Answered:
    """An image the model answered: its top class, its top k, and how sure the model is."""

    filename: str | None
    top_k: tuple[Ranked, ...]
    ood_score: float | None  # None for a model exported without one
    in_distribution: bool | None  # None for a model exported without a threshold
    format: str  # the decoded format (Pillow's name), for the page
    data: bytes = dataclasses.field(repr=False, default=b"")  # the uploaded bytes, for the page

    @property
    def label(self):
        return self.top_k[0].label

    def public(self):
        """As the JSON API shows it."""
        best = self.top_k[0]
        return {"filename": self.filename, "label": best.label, "class_id": best.class_id, "probability": best.probability,
                "top_k": [r.public() for r in self.top_k], "ood_score": self.ood_score,
                "in_distribution": self.in_distribution}


@dataclasses.dataclass(frozen=True)
class Refused:
    """An image the model never saw, and why (``status``: the HTTP code it alone would get)."""

    filename: str | None
    error: str
    status: int

    def public(self):
        return {"filename": self.filename, "error": self.error, "status": self.status}


@dataclasses.dataclass(frozen=True)
class Classification:
    """The answer to a request of uploads: one :class:`Answered` or :class:`Refused` per upload, in order."""

    model: ModelInfo
    version: int | None  # the version that answered
    images: tuple

    @property
    def all_refused(self):
        return all(isinstance(image, Refused) for image in self.images)


@dataclasses.dataclass(frozen=True)
class Inference:
    """The answer to a request of tensors: the signature's outputs and the version that gave them."""

    model: ModelInfo
    version: int | None
    outputs: Mapping


def float32_list(array):
    """float32 values as the shortest decimals that round-trip (0.93, not 0.9300000071525879)."""
    return np.asarray(array, np.float32).astype(str).astype(np.float64).tolist()


def parse_top_k(value, default):
    """``top_k`` from a query or form value; a 400 with a readable reason."""
    if value is None or value == "":
        return default
    try:
        top_k = int(value)
    except (TypeError, ValueError):
        raise ServeError(f"top_k must be a whole number, got {value!r}") from None
    if top_k < 1:
        raise ServeError(f"top_k must be at least 1, got {top_k}")
    return top_k


class InferenceService:
    """One model name over one :class:`~serve.core.model.Backend`, with the limits and metrics every protocol shares."""

    def __init__(self, backend: Backend, model_name: str, limits: Limits, metrics=None, on_answer=None):
        self.backend = backend
        self.model_name = model_name
        self.limits = limits
        self._metrics = metrics
        self._on_answer = on_answer  # on_answer(version, images): e.g. the request's log line (serve.logs)
        self._decoding = threading.BoundedSemaphore(max(1, limits.decode_concurrency))

    @property
    def kind(self):
        return self.backend.kind

    # -- the model and its versions ------------------------------------------------------
    def info(self) -> ModelInfo:
        return self.backend.info()

    def model(self, name=None, version=None, label=None) -> ModelInfo:
        """The info of the version a request names, once ``name`` (None: this server's) serves it.

        ``version`` (a number) or ``label`` (a version label of the model config) names the version;
        neither, the newest. The info's ``version`` is the number a label resolves to. Raises
        :class:`NotServed` (a 404), which each protocol words its own way.
        """
        if name is not None and name != self.model_name:
            raise NotServed(name, version, (), f"unknown model {name!r}; this server serves {self.model_name!r}")
        info = self.backend.info()
        if label is not None:
            if version is not None:
                raise ServeError(f"name a version ({version}) or a label ({label!r}), not both")
            if label not in info.labels:
                known = ", ".join(sorted(info.labels)) or "none"
                raise NotServed(name, None, info.versions, f"model {self.model_name!r} has no version label {label!r} "
                                f"(labels: {known})", label=label)
            version = info.labels[label]
        if version is None:
            return info
        if str(version) not in [str(v) for v in info.versions]:
            raise NotServed(name, version, info.versions, f"model {self.model_name!r} has no version {version!r} "
                            f"(available: {', '.join(str(v) for v in info.versions)})")
        return info if int(version) == info.version else self.backend.info(int(version))

    def _route(self, name, version, label, info=None):
        """``(info, version)``: the version a call runs on is the number a named ``version`` or ``label`` resolved
        to, or None (the newest at the moment of the call, so a swap in between fails nothing)."""
        if info is None:
            info = self.model(name, version, label)
        return info, (info.version if version is not None or label is not None else None)

    def ready(self):
        """The served version once a probe prediction succeeded; a 503 otherwise."""
        return self.backend.ready()

    # -- limits and decoding -------------------------------------------------------------
    def check_count(self, count):
        """A 413 naming the limit when one request carries more images than ``SERVE_MAX_IMAGES``."""
        if count > self.limits.max_images:
            raise ServeError(f"the request holds {count} images; this server takes at most "
                             f"{self.limits.max_images} per request (SERVE_MAX_IMAGES)", 413)

    def decode(self, datas, name_of):
        """uint8 ``[N, 32, 32, 3]`` from a tensor of encoded images; the first bad one fails the request.

        ``name_of(index)`` names an element in the error, as the caller's protocol names it.
        """
        self.check_count(len(datas))
        self.check_budget(datas)
        with tracing.span("serve.decode", {"serve.images": len(datas)}), self._decoding:
            return decoder.decode_all(datas, self.limits.max_pixels, name_of)

    def check_budget(self, datas):
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
                raise ServeError(f"the request's images declare more than {self.limits.max_request_pixels} pixels in all; "
                                 "this server decodes at most that many per request (SERVE_MAX_REQUEST_PIXELS)", 413)

    # -- prediction ----------------------------------------------------------------------
    def classify(self, uploads, top_k=None, name=None, version=None, label=None) -> Classification:
        """Decode ``uploads`` (a list of :class:`Upload`), classify the good ones and rank each answer.

        A bad image is a :class:`Refused` in its place and the rest are answered; raises
        :class:`ServeError` when the request itself cannot be (too many images, no model).
        """
        self.check_count(len(uploads))
        info, version = self._route(name, version, label)
        k = self.limits.top_k if top_k is None else top_k
        slots, good, pixels = [], [], []
        readable = [u.data for u in uploads if u.error is None]
        self.check_budget(readable)
        with tracing.span("serve.decode", {"serve.images": len(readable)}), self._decoding:
            decoded = iter(decoder.decode_many(readable, self.limits.max_pixels))
        for index, upload in enumerate(uploads):
            who = repr(upload.filename) if upload.filename else f"instance {index}"
            if upload.error is not None:  # the caller already found it unusable (bad base64)
                slots.append(Refused(upload.filename, f"{who}: {upload.error}", 400))
                continue
            result = next(decoded)
            if isinstance(result, ServeError):
                slots.append(Refused(upload.filename, f"{who} {result}", result.status))
                continue
            array, fmt = result
            slots.append((upload, fmt))
            good.append(index)
            pixels.append(array)
        if not good:
            return Classification(info, info.version, tuple(slots))
        answer = self.infer(np.stack(pixels), version=version, info=info)
        ranked = self.top_k(answer, k)
        scores, inside = _confidence_of(answer.outputs, len(good))
        for row, index in enumerate(good):
            upload, fmt = slots[index]
            slots[index] = Answered(upload.filename, tuple(ranked[row]), scores[row], inside[row], fmt, upload.data)
        return Classification(info, answer.version, tuple(slots))

    def infer(self, pixels, name=None, version=None, info=None, label=None) -> Inference:
        """``serving_default`` on uint8 pixels ``[N, 32, 32, 3]``; every image counted once in the metrics.

        ``info``: what :meth:`model` answered for this request's ``version`` or ``label``, when the caller asked already;
        with it, the version it resolved to answers, though a new config has retired it since (the backend finishes
        what was sent to a version before it retired).
        """
        if info is None:
            self.check_count(len(pixels))
        info, version = self._route(name, version, label, info)
        try:
            prediction = self.backend.infer(pixels, None if version is None else int(version))
        except Shed as e:
            if self._metrics is not None:
                self._metrics.shed.labels(e.reason).inc()
            raise
        self._observe(prediction.version, prediction.outputs, len(pixels))
        return Inference(info, prediction.version, prediction.outputs)

    def run(self, signature_name, inputs, name=None, version=None, label=None, info=None) -> Inference:
        """Any signature of the model on ``{input key: array}``, as TF Serving's APIs call one.

        ``predict_images`` (encoded images) is decoded here and answered by ``serving_default``, so
        no user bytes reach a model; ``serving_default`` on pixels goes the way of :meth:`infer`.
        ``info``: as for :meth:`infer` (a version a label named then runs even if the label moves meanwhile).
        """
        info, version = self._route(name, version, label, info)
        if signature_name not in info.signature_defs:
            raise ServeError(f"signature {signature_name!r} not found; this model has {sorted(info.signature_defs)}")
        if signature_name == SIGNATURE_BYTES and set(inputs) == {INPUT_BYTES}:
            datas = np.asarray(inputs[INPUT_BYTES], dtype=object)
            if datas.ndim != 1:
                raise ServeError(f"input {INPUT_BYTES!r} must be a list of encoded images (shape [N]), got shape {list(datas.shape)}")
            pixels = self.decode(datas.tolist(), lambda index: f"{INPUT_BYTES}[{index}]")
            return self.infer(pixels, version=version, info=info)
        try:
            signatures.check_inputs(signature_name, info.input_specs[signature_name], inputs)
        except ValueError as e:
            raise ServeError(str(e)) from None
        if signature_name == SIGNATURE_PIXELS and set(inputs) == {INPUT_PIXELS}:
            self.check_count(len(inputs[INPUT_PIXELS]))
            return self.infer(inputs[INPUT_PIXELS], version=version, info=info)
        outputs = self.backend.run(signature_name, inputs, None if version is None else int(version))
        served = info.version if version is None else int(version)
        if OUTPUT_PROBABILITIES in outputs:
            self._observe(served, outputs, len(np.asarray(outputs[OUTPUT_PROBABILITIES])))
        return Inference(info, served, outputs)

    def top_k(self, answer: Inference, k):
        """Each image's ``k`` best classes as :class:`Ranked`, best first, with the model's class names."""
        probabilities = np.asarray(answer.outputs[OUTPUT_PROBABILITIES], np.float32)
        names = answer.model.label_names(answer.outputs, probabilities.shape[1])
        order, best = rank(probabilities, k)
        # One conversion for the whole batch, not one per image: it is most of the per-image cost here.
        values = float32_list(best)
        return [[Ranked(names[c], c, p) for c, p in zip(ids, row)] for ids, row in zip(order.tolist(), values)]

    def _observe(self, version, outputs, images):
        if self._metrics is not None and images:
            self._metrics.images.inc(images)
            self._metrics.answers(version, outputs)
        if self._on_answer is not None and images:
            self._on_answer(version, images)


def _confidence_of(outputs, rows):
    """Each row's ``ood_score`` (a float) and ``in_distribution`` (a bool), or None where the model has neither.

    The label is answered either way: ``in_distribution: false`` says the image looks like none of
    the classes, and leaves it to the caller what to do with the label.
    """
    scores = float32_list(outputs[OUTPUT_OOD_SCORE]) if OUTPUT_OOD_SCORE in outputs else [None] * rows
    inside = (np.asarray(outputs[OUTPUT_IN_DISTRIBUTION], bool).tolist() if OUTPUT_IN_DISTRIBUTION in outputs
              else [None] * rows)
    return scores, inside
