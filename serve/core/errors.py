"""The one error the serving core raises: a message and the HTTP status it goes out with.

Every protocol adapter translates it into its own wire form (a JSON ``{"error": ...}`` with the
status, the form page with the message); no other exception carries a request's failure.
"""


class ServeError(Exception):
    """A request the server cannot answer as asked; ``status`` is the HTTP code to answer with.

    4xx: the request is at fault (400 malformed, 404 no such model or version, 413 too large,
    415 a format this server does not read); 500: the model failed; 503: try again later.
    """

    #: Seconds after which a retry may succeed, sent as ``Retry-After`` (None: no such header).
    retry_after = None

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


class Shed(ServeError):
    """A 503 for load this worker will not take on now (``reason``: ``queue_full`` or ``timeout``); retry soon."""

    retry_after = 1

    def __init__(self, message, reason):
        super().__init__(message, 503)
        self.reason = reason


class NotServed(ServeError):
    """A 404 for a model name or version this server does not serve; each protocol words it its own way."""

    def __init__(self, name, version, versions, message, label=None):
        super().__init__(message, 404)
        self.name, self.version, self.versions, self.label = name, version, tuple(versions), label
