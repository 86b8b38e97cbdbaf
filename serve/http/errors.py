"""Every refusal an HTTP request can get, answered one way: JSON ``{"error": ...}`` under the API, the page on the form.

A :class:`~serve.core.errors.ServeError` raised anywhere (the gate's hook, a protocol, the core, a backend)
goes out with the status of its kind (:data:`serve.core.errors.WIRE`), ``Retry-After`` when it says when to
retry, a challenge with a 401 and the caller's window with a 429; werkzeug's own errors (404, 405, 413)
and anything unexpected (a 500, logged) are answered the same way. A protocol that words a refusal its
own way (TF Serving's "Servable not found") registers a handler on its blueprint, which Flask asks first.
"""

from flask import g, jsonify, request
from werkzeug.exceptions import HTTPException

from serve.core.errors import RateLimited, ServeError, Unauthenticated
from serve.http.security import area_of
from serve.telemetry.logs import printable

REALM = "serve"
HOW_TO_SEND_A_KEY = "send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"


def json_error(e):
    """A :class:`~serve.core.errors.ServeError` as every JSON route answers it: ``{"error": ...}``, its status and headers."""
    response = jsonify(error=_message(e))
    response.status_code = e.status
    _headers(response, e)
    return response


def _message(e):
    if isinstance(e, Unauthenticated) and e.reason == "missing_key":
        return f"this route needs an API key: {HOW_TO_SEND_A_KEY}"
    return str(e)


def _headers(response, e):
    if e.retry_after is not None:
        response.headers["Retry-After"] = str(e.retry_after)
    if isinstance(e, RateLimited) and e.window is not None:
        g.serve_window = e.window  # the security headers hook writes X-RateLimit-* from it
    if isinstance(e, Unauthenticated):
        if area_of(request.path) == "form":
            response.headers["WWW-Authenticate"] = f'Basic realm="{REALM}", charset="UTF-8"'
        else:
            invalid = ', error="invalid_token"' if e.reason == "wrong_key" else ""
            response.headers["WWW-Authenticate"] = f'Bearer realm="{REALM}"{invalid}'


def _wants_json():
    """Every area but the form's answers JSON: the API, the metrics, the probes."""
    return area_of(request.path) != "form"


def init_app(app, settings, page):
    """Answer every error of ``app``; ``page(message, status)`` renders the form page with a message on it."""

    @app.errorhandler(ServeError)
    def _refused(e):
        if _wants_json():
            return json_error(e)
        response = app.make_response(page(_page_message(e), e.status))
        _headers(response, e)
        return response

    @app.errorhandler(HTTPException)
    def _http_error(e):
        if _wants_json():
            description = e.description
            if e.code == 413:
                description = f"the request is larger than the {settings.max_upload_mb:g} MiB limit"
            elif e.code == 404:
                description = f"no route {printable(request.path)}"
            return jsonify(error=description), e.code
        if e.code == 413:
            return page(f"The upload is larger than the {settings.max_upload_mb:g} MiB limit.", 413)
        return e

    @app.errorhandler(Exception)
    def _unexpected(e):
        app.logger.exception("unhandled error on %s", request.path)
        return jsonify(error=f"internal error: {type(e).__name__}"), 500


def _page_message(e):
    """A refusal as the form page words it for a person."""
    if isinstance(e, Unauthenticated):
        if e.reason == "missing_key":
            return ("This page needs an API key. Reload it and give the key as the password when the browser asks "
                    "(any user name).")
        return "That API key is not valid. Reload to try another."
    if isinstance(e, RateLimited):
        return f"Too many requests from you: the limit is {e.limit}. Try again in {e.retry_after} s."
    return str(e)
