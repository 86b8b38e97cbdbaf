"""The one error of the serving core, its kinds, and the one table that puts each on the wire.

A refusal is a subclass of :class:`ServeError`; :data:`WIRE` gives each kind its HTTP status and its
gRPC status code, and every protocol answers by that table (``serve.http`` as JSON or the form page,
``serve.grpc.edge`` as a status code). No code anywhere tells one refusal from another by its text.
"""

#: The longest piece of a request (a model name, a label, a service name) an error message repeats.
MAX_ECHO_CHARS = 80


class ServeError(Exception):
    """A request the server cannot answer as asked. Raise a kind below, never this class itself."""

    #: Seconds after which a retry may succeed, sent as ``Retry-After`` (None: no such header).
    retry_after = None

    @property
    def status(self):
        """The HTTP status this kind of refusal goes out with (:data:`WIRE`)."""
        return wire(type(self))[0]

    @property
    def code(self):
        """The name of the gRPC status code this kind of refusal goes out with (:data:`WIRE`)."""
        return wire(type(self))[1]


class BadRequest(ServeError):
    """The request is malformed, or asks for what the model does not take (a wrong shape, type, signature)."""


class Unauthenticated(ServeError):
    """No API key, or a wrong one (``reason``: ``missing_key`` or ``wrong_key``)."""

    def __init__(self, message, reason):
        super().__init__(message)
        self.reason = reason


class NotFound(ServeError):
    """No such route, model, version or label."""


class NotServed(NotFound):
    """A model name, version or label this server does not serve; each protocol words it its own way."""

    def __init__(self, message, name=None, version=None, label=None, versions=()):
        super().__init__(message)
        self.name, self.version, self.label, self.versions = name, version, label, tuple(versions)


class TooLarge(ServeError):
    """More than a limit allows: the body, an image's pixels, a request's pixels, a tensor's declared size."""


class TooManyImages(TooLarge):
    """More images in one request than ``SERVE_MAX_IMAGES``."""


class Unsupported(ServeError):
    """A real image in a format this server does not read, or a body encoding it does not know."""


class RateLimited(ServeError):
    """The caller's budget for this area is spent: ``limit`` (e.g. "2 per 1 minute") and its ``window``
    (:class:`serve.core.admission.Window`); ``retry_after`` says when the window frees a request."""

    def __init__(self, message, retry_after, limit="", window=None):
        super().__init__(message)
        self.retry_after, self.limit, self.window = retry_after, limit, window


class ModelFailed(ServeError):
    """The model (or the server) failed on a request it should have answered."""


class Unavailable(ServeError):
    """Not now: no model loaded yet, or TF Serving down or late. Retry later."""


class Shed(Unavailable):
    """Load this worker will not take on now (``reason``: ``queue_full`` or ``timeout``); retry soon."""

    retry_after = 1

    def __init__(self, message, reason):
        super().__init__(message)
        self.reason = reason


class DeadlineExceeded(ServeError):
    """The caller's own deadline passed before the answer was ready."""


#: Each kind's ``(HTTP status, gRPC status code name)``. A request over a limit is ``INVALID_ARGUMENT``, as TF
#: Serving answers a batch over its ``max_batch_size``: it fails however often it is retried, while
#: ``RESOURCE_EXHAUSTED`` (what gRPC itself answers a message over its size limit) is what retry policies
#: treat as transient, and is kept for a spent rate budget.
WIRE = {
    BadRequest: (400, "INVALID_ARGUMENT"),
    Unauthenticated: (401, "UNAUTHENTICATED"),
    NotFound: (404, "NOT_FOUND"),
    TooLarge: (413, "INVALID_ARGUMENT"),
    Unsupported: (415, "INVALID_ARGUMENT"),
    RateLimited: (429, "RESOURCE_EXHAUSTED"),
    ModelFailed: (500, "INTERNAL"),
    Unavailable: (503, "UNAVAILABLE"),
    DeadlineExceeded: (504, "DEADLINE_EXCEEDED"),
}


def wire(kind):
    """``(HTTP status, gRPC code name)`` of an error class: its own entry in :data:`WIRE`, else its nearest base's."""
    for base in kind.__mro__:
        if base in WIRE:
            return WIRE[base]
    return WIRE[ModelFailed]


def echo(text):
    """``text`` from a request, as an error message may repeat it: printable, and at most :data:`MAX_ECHO_CHARS`."""
    text = str(text)
    shown = text if len(text) <= MAX_ECHO_CHARS else text[: MAX_ECHO_CHARS - 1] + "\u2026"
    return repr(shown)
