"""What a server open to the internet needs: API keys, rate limits, CORS, security headers, proxies.

Typical usage (``create_app`` does this; the settings are in :mod:`serve.settings`)::

    SERVE_API_KEY_FILE=/run/secrets/api-keys SERVE_RATE_LIMIT_API="10/second;300/minute" \\
    SERVE_RATE_LIMIT_STORE=redis://redis:6379/0 SERVE_TRUSTED_PROXIES=1 python -m serve

Every part is off by default except the security headers, so a plain ``python -m serve`` behaves
as before. The areas of the site:

* ``api``: ``/api/``, ``/v1/``, ``/v2/`` (every protocol route, by prefix). Needs an API key when
  any is configured: ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``.
* ``form``: ``/`` and every other page. Needs a key too when keys are on and
  ``SERVE_FORM_NEEDS_KEY`` is not 0; a browser sends it as the password of HTTP Basic
  authentication, which it asks for by itself (the user name is ignored).
* ``metrics``: ``/metrics``, with keys of its own (``SERVE_METRICS_KEYS``), so that a scraper's
  credential opens no model and a client's key shows no metrics. With API keys on and no metrics
  keys, it takes the API keys: it is never left open while the API is closed.
* ``open``: ``/healthz``, ``/readyz`` and ``/static/`` never need a key, and have a rate limit of
  their own (``SERVE_RATE_LIMIT_OPEN``, off by default: a kubelet probes from one address).

Keys are compared with :func:`hmac.compare_digest`, against every configured key. They are never
logged: a client's rate-limit bucket is named by a digest of its key, and a key in a URL is not
accepted. Rejections are counted in ``serve_rejections_total{reason, area}``.

Rate limits (Flask-Limiter) count per client and per area: every route of an area draws on one
budget (the predict routes of the three protocols share the API's), so a client cannot multiply its
limit by spreading requests over routes. A client is its API key when it sends a valid one, else
its address (after ``ProxyFix``), so a wrong-key guesser is limited by address. Unauthenticated
requests count too. Answers over the limit are 429 with ``Retry-After``: JSON on
the API, the form page with a message on the form.
"""

import hashlib
import hmac
import time

from flask import current_app, g, jsonify, request

from contract import API_ROOTS

API_PREFIXES = tuple(root + "/" for root in API_ROOTS)
OPEN_PATHS = ("/healthz", "/readyz")
OPEN_PREFIXES = ("/static/",)
METRICS_PATH = "/metrics"
REALM = "serve"

# No inline script and no inline style: the page's script and CSS are files under serve/static/;
# uploaded images are shown from data: URLs (the results page) and blob: URLs (the script's
# thumbnails), and the script posts to this origin's API alone. JSON answers get the strictest
# policy (they load nothing).
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
OTHER_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'"
HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
# What a page on an allowed origin may send, and read from an answer besides the simple headers.
CORS_ALLOWED = ["Authorization", "X-API-Key", "Content-Type", "Inference-Header-Content-Length"]
CORS_EXPOSED = ["Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Inference-Header-Content-Length"]


class KeyFileError(RuntimeError):
    """A configured key file that cannot be read or holds no key: the server refuses to start."""


def split_list(value):
    """``"a, b,,c"`` or ``["a", "b"]`` -> ``["a", "b", "c"]``."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    return [item.strip() for item in items if item and item.strip()]


def read_key_file(path):
    """The keys in ``path``: one a line; blank lines and ``#`` comments skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise KeyFileError(f"cannot read the key file {path}: {e.strerror or e}") from e
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise KeyFileError(f"the key file {path} holds no key (one a line; # starts a comment)")
    return keys


def load_keys(listed, path):
    """Keys from a comma-separated setting and an optional file, as bytes, once each."""
    keys = split_list(listed) + (read_key_file(path) if path else [])
    return tuple(dict.fromkeys(key.encode("utf-8") for key in keys))


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


def matches(presented, keys):
    """Whether ``presented`` is one of ``keys``, in time that depends on neither."""
    candidate = presented.encode("utf-8")
    found = False
    for key in keys:  # every key, always: no early exit that would time which one matched
        found |= hmac.compare_digest(candidate, key)
    return found


class Security:
    """The settings of one app, and the request hooks that apply them."""

    def __init__(self, settings, metrics):
        self.metrics = metrics
        self.api_keys = load_keys(settings.api_keys, settings.api_key_file)
        self.metrics_keys = load_keys(settings.metrics_keys, settings.metrics_key_file)
        self.keys = {
            "api": self.api_keys,
            "form": self.api_keys if settings.form_needs_key else (),
            "metrics": self.metrics_keys or self.api_keys,
            "open": (),
        }
        # The values were checked by serve.settings when the app was made.
        self.limits = {
            "api": settings.rate_limit_api or settings.rate_limit,
            "form": settings.rate_limit_form or settings.rate_limit,
            "metrics": settings.rate_limit,
            "open": settings.rate_limit_open,
        }
        self.store = settings.rate_limit_store
        self.cors_origins = split_list(settings.cors_origins)
        self.trusted_proxies = settings.trusted_proxies
        self.limiter = None
        #: The Vary headers of each area's answers: Origin under CORS, the key headers where keys are asked for.
        self._vary = {
            area: (*(("Origin",) if self.cors_origins else ()), *(("Authorization", "X-API-Key") if keys else ()))
            for area, keys in self.keys.items()
        }

    # -- identity ---------------------------------------------------------------------------

    def client_id(self):
        """The rate-limit bucket's name: a digest of a valid key, else the client's address."""
        cached = g.get("serve_client_id")
        if cached is not None:
            return cached
        key = presented_key()
        every_key = self.api_keys + self.metrics_keys
        if key is not None and every_key and matches(key, every_key):
            client = "key:" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
        else:
            client = "addr:" + (request.remote_addr or "unknown")
        g.serve_client_id = client
        return client

    # -- hooks ------------------------------------------------------------------------------

    def check_key(self):
        """before_request: a 401 when the request's area needs a key and it has no right one."""
        if request.method == "OPTIONS":  # CORS preflights carry no credentials, by the standard
            return None
        area = area_of(request.path)
        keys = self.keys[area]
        if not keys:
            return None
        key = presented_key()
        if key is not None and matches(key, keys):
            return None
        reason = "missing_key" if key is None else "wrong_key"
        self.metrics.rejections.labels(reason, area).inc()
        return self._unauthorized(area, reason)

    def _unauthorized(self, area, reason):
        if area == "form":
            from serve.protocols import web

            message = (
                "This page needs an API key. Reload it and give the key as the password when the browser "
                "asks (any user name)." if reason == "missing_key" else "That API key is not valid. Reload to try another."
            )
            response = current_app.make_response(web.render_error(message, 401))
            response.headers["WWW-Authenticate"] = f'Basic realm="{REALM}", charset="UTF-8"'
            return response
        if reason == "missing_key":
            message = "this route needs an API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
            challenge = f'Bearer realm="{REALM}"'
        else:
            message = "the API key is not valid"
            challenge = f'Bearer realm="{REALM}", error="invalid_token"'
        response = jsonify(error=message)
        response.status_code = 401
        response.headers["WWW-Authenticate"] = challenge
        return response

    def rate_limit_for_request(self):
        """The limit string for this request's area ('' = none); one count per client and area."""
        if request.method == "OPTIONS":  # a browser's CORS preflight is not a use of the API
            return ""
        return self.limits[area_of(request.path)]

    def too_many_requests(self, e):
        """The 429 answer: JSON, or the form page with a message a person can read."""
        area = area_of(request.path)
        self.metrics.rejections.labels("rate_limited", area).inc()
        current = self.limiter.current_limit if self.limiter is not None else None
        wait = max(1, int(current.reset_at - time.time())) if current is not None else 1
        if area == "form":
            from serve.protocols import web

            return web.render_error(
                f"Too many requests from you: the limit is {e.description}. Try again in {wait} s.", 429
            )
        return jsonify(error=f"too many requests: the limit is {e.description}; retry after {wait} s"), 429

    def headers(self, response):
        """after_request: the security and caching headers, on every answer (errors included)."""
        have = response.headers
        # Which headers the answer has, read once: a werkzeug Headers lookup of a missing name raises
        # (and builds) a BadRequestKeyError, and these are missing on nearly every answer.
        present = {name.lower() for name in have.keys()}
        if "content-security-policy" not in present:
            have.add("Content-Security-Policy", PAGE_CSP if response.mimetype == "text/html" else OTHER_CSP)
        for name, value in HEADERS.items():
            if name.lower() not in present:
                have.add(name, value)
        # Every answer but a static file is made for this request and this caller: no cache, shared or
        # private, may keep it (a shared cache could hand a keyed GET such as /metrics to a caller
        # without the key). Answers that depend on request headers say which.
        path = request.path
        if not path.startswith(OPEN_PREFIXES):
            have["Cache-Control"] = "no-store"
        vary = self._vary[area_of(path)]
        if vary:
            response.vary.update(vary)
        # Flask-Limiter writes Retry-After on every limited answer; it means something only on these.
        if "retry-after" in present and response.status_code not in (429, 503):
            have.pop("Retry-After", None)
        return response


#: Seconds a Redis (or Valkey) rate-limit store may take to connect or to answer before the limiter
#: counts in memory instead: one that accepts and never answers must not stall every request.
STORE_TIMEOUT_S = 0.25


def store_options(uri):
    """The rate-limit store's connection options: sub-second timeouts for Redis and Valkey, none for the others."""
    scheme = uri.partition("://")[0]
    if scheme.startswith(("redis", "valkey")):
        return {"socket_timeout": STORE_TIMEOUT_S, "socket_connect_timeout": STORE_TIMEOUT_S}
    return {}


def init_app(app, settings, metrics):
    """Install the proxy fix, headers, rate limits, API keys and CORS that ``settings`` ask for."""
    security = Security(settings, metrics)
    app.extensions["serve.security"] = security

    if security.trusted_proxies:
        from werkzeug.middleware.proxy_fix import ProxyFix

        n = security.trusted_proxies
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=n, x_proto=n, x_host=n)

    app.after_request(security.headers)

    # The limiter's before_request runs before the key check, so key guessing is limited too.
    if any(security.limits.values()):
        from flask_limiter import Limit, Limiter, RateLimitExceeded

        security.limiter = Limiter(
            key_func=security.client_id,
            # shared, with the area as its scope: one count per client for every route of an area.
            default_limits=[Limit(security.rate_limit_for_request, shared=True, scope=lambda endpoint: area_of(request.path))],
            storage_uri=security.store,
            storage_options=store_options(security.store),
            headers_enabled=True,
            # If Redis goes away, count in memory (per worker) rather than answer 500; an error of the
            # store while it is being found out is logged and the request let through, never a 500.
            in_memory_fallback_enabled=True,
            swallow_errors=True,
            key_prefix="serve",
        )
        security.limiter.init_app(app)
        app.register_error_handler(RateLimitExceeded, security.too_many_requests)

    app.before_request(security.check_key)

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
