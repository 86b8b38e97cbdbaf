"""The one error the server answers with: a message and the HTTP status it goes out with."""


class ServeError(Exception):
    """A request the server cannot answer as asked; ``status`` is the HTTP code to answer with.

    4xx: the request is at fault (400 malformed, 404 no such model or version, 413 too large,
    415 a format this server does not read); 500: the model failed; 503: try again later.
    """

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


def check_image_count(count, limit):
    """A 413 naming ``limit`` when one request carries more than ``limit`` images (``SERVE_MAX_IMAGES``)."""
    if count > limit:
        raise ServeError(f"the request holds {count} images; this server takes at most {limit} per request (SERVE_MAX_IMAGES)", 413)
