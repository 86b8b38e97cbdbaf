"""What an HTTP server open to the internet needs around the core's gate: areas, headers, CORS, proxies.

Typical usage (``create_app`` does this; the settings are in :mod:`serve.settings`)::

    SERVE_API_KEY_FILE=/run/secrets/api-keys SERVE_RATE_LIMIT_API="10/second;300/minute" \\
    SERVE_RATE_LIMIT_STORE=redis://redis:6379/0 SERVE_TRUSTED_PROXIES=1 python -m serve

Every request is admitted by the core's :class:`serve.core.admission.Gate` before its body is read, for the
area its path is in (:func:`area_of`): ``api`` (``/api/``, ``/v1/``, ``/v2/``: every protocol route, by
prefix), ``metrics`` (``/metrics``), ``open`` (``/healthz``, ``/readyz``, ``/static/``) or ``form`` (``/`` and
every other page). The key is ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``; a browser sends it as
the password of HTTP Basic authentication, which it asks for by itself on the form (the user name is
ignored). A key in a URL is not accepted. The caller's address is the proxy's rightmost entry after
``SERVE_TRUSTED_PROXIES`` (werkzeug's ``ProxyFix``). Answers of a rate-limited area carry
``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset``; a 429 carries ``Retry-After``
(:mod:`serve.http.errors` words the refusals).

Every answer gets the security headers (a Content-Security-Policy, ``nosniff``, no framing, no referrer)
and ``Cache-Control: no-store`` but a static file, and says what it varies on.
"""

from flask import g, request

from contract import API_ROOTS
from serve.core.admission import Caller

API_PREFIXES = tuple(root + "/" for root in API_ROOTS)
OPEN_PATHS = ("/healthz", "/readyz")
OPEN_PREFIXES = ("/static/",)
METRICS_PATH = "/metrics"

# No inline script and no inline style: the page's script and CSS are files under serve/static/;
# uploaded images are shown from data: URLs (the results page) and blob: URLs (the script's
# thumbnails), and the script posts to this origin's API alone. JSON answers get the strictest
# policy (they load nothing).
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
OTHER_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'"
HEADERS = (("X-Content-Type-Options", "nosniff"), ("X-Frame-Options", "DENY"), ("Referrer-Policy", "no-referrer"))
# What a page on an allowed origin may send, and read from an answer besides the simple headers.
CORS_ALLOWED = ["Authorization", "X-API-Key", "Content-Type", "Inference-Header-Content-Length", "X-Request-Timeout"]
CORS_EXPOSED = ["Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Inference-Header-Content-Length"]


def area_of(path):
    """``api``, ``metrics``, ``open`` or ``form`` (see the module docstring)."""
    if path.startswith(API_PREFIXES) or path in API_ROOTS:
        return "api"
    if path == METRICS_PATH:
        return "metrics"
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        return "open"
    return "form"


def presented_key():
    """The key the request carries (``X-API-Key``, Bearer token, or Basic password), or None."""
    header = request.headers.get("X-API-Key")
    if header:
        return header.strip()
    auth = request.authorization
    if auth is None:
        return None
    if auth.type == "bearer":
        return auth.token or None
    if auth.type == "basic":
        return auth.password or None
    return None


class Security:
    """The core's gate as HTTP hooks, and the headers every answer gets."""

    def __init__(self, settings, gate):
        self.gate = gate
        self.cors_origins = [origin for origin in settings.cors_origins.split(",") if origin]
        #: The Vary headers of each area's answers: Origin under CORS, the key headers where keys are asked for.
        self._vary = {
            area: (*(("Origin",) if self.cors_origins else ()), *(("Authorization", "X-API-Key") if keys else ()))
            for area, keys in gate.keys.items()
        }

    def admit(self, area):
        """The caller admitted to ``area`` (the request path's) by the gate, or its refusal raised."""
        if request.method == "OPTIONS" or not self.gate.guarded(area):  # CORS preflights carry no credentials
            return
        admitted = self.gate.admit(Caller(presented_key(), request.remote_addr or "unknown"), area)
        g.serve_caller, g.serve_window = admitted.identity, admitted.window

    def headers(self, response, area, static):
        """The security, caching and rate-limit headers, on every answer (errors included); ``static``: a static file."""
        have = response.headers
        html = have.get("Content-Type", "").startswith("text/html")
        have.add("Content-Security-Policy", PAGE_CSP if html else OTHER_CSP)
        for name, value in HEADERS:
            have.add(name, value)
        # Every answer but a static file is made for this request and this caller: no cache, shared or
        # private, may keep it (a shared cache could hand a keyed GET such as /metrics to a caller
        # without the key). Answers that depend on request headers say which.
        if not static:
            have.add("Cache-Control", "no-store")
        vary = self._vary[area]
        if vary:
            response.vary.update(vary)
        window = g.get("serve_window")
        if window is not None:
            have.add("X-RateLimit-Limit", str(window.limit))
            have.add("X-RateLimit-Remaining", str(window.remaining))
            have.add("X-RateLimit-Reset", str(int(window.reset_at)))
        return response


def init_app(app, settings, gate):
    """The :class:`Security` of ``app`` (its hooks are :mod:`serve.http.exchange`'s), and the proxy fix and CORS that
    ``settings`` ask for."""
    security = Security(settings, gate)
    app.extensions["serve.security"] = security
    if settings.trusted_proxies:
        from werkzeug.middleware.proxy_fix import ProxyFix

        n = settings.trusted_proxies
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=n, x_proto=n, x_host=n)
    if security.cors_origins:
        from flask_cors import CORS

        CORS(
            app,
            resources={rf"/({'|'.join(root.strip('/') for root in API_ROOTS)})(/.*)?": {}},
            origins=security.cors_origins,
            methods=["GET", "POST"],
            allow_headers=CORS_ALLOWED,
            expose_headers=CORS_EXPOSED,
            max_age=600,
        )
    return security
