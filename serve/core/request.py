"""The one request every protocol builds and the one answer it gets back (after KServe's ``InferRequest``/``InferResponse``).

A protocol module (:mod:`serve.protocols`) turns its wire format into an :class:`InferRequest` whose
inputs are :class:`Tensor` s as the wire carried them, unchecked; :meth:`serve.core.service.InferenceService.infer`
checks everything once (names, counts, sizes, types, ranges, shapes, pixel budgets) and answers an
:class:`InferResponse`, or raises one :class:`serve.core.errors.ServeError` kind.
"""

import dataclasses
from collections.abc import Mapping

import numpy as np

from contract import SIGNATURE_PIXELS
from contract.ranking import top_k as rank
from serve.core.model import ModelInfo

#: The contract's names of the value types a wire may declare (v2's UINT8, TF Serving's DT_UINT8...): numpy names, and bytes.
BYTES = "bytes"


@dataclasses.dataclass(frozen=True, slots=True)
class Tensor:
    """One input as its protocol carried it, not yet checked.

    ``values`` is one of: the tensor's bytes, packed little-endian (``packed``; a ``bytes`` tensor packed is
    v2's layout, each element a 4-byte length and its bytes); a flat sequence of values; values nested in
    lists (JSON), or an array a JSON reader already made of them; or a sequence of :class:`Upload` (encoded
    images from a form or a JSON API, each with its file name and its own fault).
    """

    values: object
    shape: tuple[int, ...] | None = None  # None: the nesting of ``values`` says
    dtype: str | None = None  # a numpy type name or BYTES; None: the values' own types (JSON)
    packed: bool = False
    #: TensorFlow's rule for its typed fields: a flat list shorter than the shape repeats its last value.
    fill_last: bool = False
    #: Where the wire put packed values, as its refusals name it (``tensor_content``, ``raw_input_contents``).
    field: str = "its data"


@dataclasses.dataclass(frozen=True, slots=True)
class Upload:
    """One encoded image of a request: its bytes, or ``error``, why the request's encoding of it could not be read."""

    filename: str | None = None
    data: bytes = b""
    error: str | None = None  # e.g. "is not valid base64": that image alone is refused (400)


@dataclasses.dataclass(frozen=True, slots=True)
class InferRequest:
    """What a caller asks of the model, whatever protocol it spoke."""

    #: ``{input key: Tensor}``; the key None stands for the signature's one input (TF Serving's unnamed ``instances``).
    inputs: Mapping[str | None, Tensor]
    model_name: str | None = None  # None: this server's model
    version: int | str | None = None  # a number, or None: the newest (or the label's)
    label: str | None = None  # a version label of the model config
    signature: str = SIGNATURE_PIXELS
    outputs: tuple[str, ...] | None = None  # the outputs to answer (None: all of the signature's)
    top_k: int | None = None  # classes ranked per image (None: SERVE_TOP_K)
    #: Each encoded image answered on its own: a bad one is refused in its place and the rest answered (the
    #: form and the JSON API). Otherwise the first bad image fails the request, as a tensor does.
    per_image: bool = False
    deadline: float | None = None  # time.monotonic() by which the caller needs the answer (None: the server's cap)
    id: str | None = None  # the request id (X-Request-Id, x-request-id)
    caller: str | None = None  # who asked: the rate limiter's identity (serve.core.admission)
    #: The protocol's name of each value type (numpy type -> name, e.g. v2's ``UINT8``), for its refusals;
    #: None: TensorFlow's (``DT_UINT8``), as TF Serving's APIs name them.
    dtype_names: Mapping | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Ranked:
    """One class of an image's top k."""

    label: str
    class_id: int
    probability: float

    def public(self):
        """As the JSON API shows it (``dataclasses.asdict`` deep-copies: a tenth of a 64-image answer's time)."""
        return {"label": self.label, "class_id": self.class_id, "probability": self.probability}


@dataclasses.dataclass(frozen=True, slots=True)
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


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """An image the model never saw, and why (``error``: the :class:`serve.core.errors.ServeError` it alone would get)."""

    filename: str | None
    error: Exception

    @property
    def status(self):
        return self.error.status

    def public(self):
        return {"filename": self.filename, "error": str(self.error), "status": self.status}


@dataclasses.dataclass(frozen=True)
class InferResponse:
    """The model's answer: the outputs asked for, the version that gave them, and for a per-image request each image's slot."""

    model: ModelInfo
    version: int | None  # the version that answered
    outputs: Mapping  # {output key: array [N, ...]} of the images answered, in order
    top_k: int  # classes ranked per image
    #: A per-image request's answer: an :class:`Answered` or a :class:`Refused` for each image, in order.
    images: tuple = ()

    @property
    def all_refused(self):
        return bool(self.images) and all(isinstance(image, Refused) for image in self.images)

    def ranked(self, k=None):
        """Each answered image's ``k`` (default: the request's top k) best classes as :class:`Ranked`, best first."""
        return ranked(self.model, self.outputs, self.top_k if k is None else k)


def ranked(model, outputs, k):
    """``[[Ranked]]``: each image's ``k`` best classes with ``model``'s class names, best first."""
    from contract import OUTPUT_PROBABILITIES

    probabilities = np.asarray(outputs[OUTPUT_PROBABILITIES], np.float32)
    names = model.label_names(outputs, probabilities.shape[1])
    order, best = rank(probabilities, k)
    # One conversion for the whole batch, not one per image: it is most of the per-image cost here.
    values = float32_list(best)
    return [[Ranked(names[c], c, p) for c, p in zip(ids, row)] for ids, row in zip(order.tolist(), values)]


def float32_list(array):
    """float32 values as the shortest decimals that round-trip (0.93, not 0.9300000071525879)."""
    return np.asarray(array, np.float32).astype(str).astype(np.float64).tolist()
