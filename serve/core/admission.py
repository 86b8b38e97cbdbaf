"""Who may call, and how often: API keys and rate limits, one gate for HTTP and gRPC alike.

The HTTP hook (:mod:`serve.http.security`) and the gRPC interceptor (:mod:`serve.grpc.interceptors`) each
build a :class:`Caller` (the key it presented, its address) and ask :meth:`Gate.admit` for an area of the
site, before the request's body or message is read:

* ``api``: every protocol's routes and calls (the JSON API, TF Serving's and the Open Inference Protocol's,
  over HTTP and gRPC). Needs an API key when any is configured.
* ``form``: the upload page. Needs a key too when keys are on and ``SERVE_FORM_NEEDS_KEY`` is not 0.
* ``metrics``: ``/metrics``, with keys of its own (``SERVE_METRICS_KEYS``), else the API keys.
* ``open``: liveness, readiness and gRPC health, never a key; a rate limit of their own (``SERVE_RATE_LIMIT_OPEN``).

The rate limit comes first, so key guessing is limited too. A caller is its API key when it presents a
valid one (by a digest: keys are never stored in the limiter, nor logged), else its address; one budget per
caller and area, counted by the ``limits`` package in one store (``SERVE_RATE_LIMIT_STORE``) for HTTP and
gRPC alike, with the moving-window strategy where the store has it (exact: no burst of twice the limit
across a window's edge). ``memory://`` counts in each worker process: with W workers a caller may get up
to W budgets; a Redis (or Valkey, Memcached, MongoDB) store is one count for every worker and replica. If
that store fails, the gate counts in memory for :data:`STORE_RETRY_S` seconds and tries it again: a store
that went away never refuses a request it should answer, nor answers a 500.
"""

import dataclasses
import hashlib
import hmac
import logging
import time

from serve.core.errors import RateLimited, Unauthenticated

AREAS = ("api", "form", "metrics", "open")
#: Seconds a Redis (or Valkey) store may take to connect or to answer before the gate counts in memory instead.
STORE_TIMEOUT_S = 0.25
#: Seconds the gate counts in memory after its store failed, before it tries the store again.
STORE_RETRY_S = 5.0

log = logging.getLogger(__name__)


class KeyFileError(RuntimeError):
    """A configured key file that cannot be read or holds no key: the server refuses to start."""


@dataclasses.dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the API key the request presented (None: none), and the address it came from."""

    key: str | None
    address: str


@dataclasses.dataclass(frozen=True, slots=True)
class Window:
    """Where a caller stands in its tightest rate limit: what HTTP's ``X-RateLimit-*`` headers say."""

    limit: int
    remaining: int
    reset_at: float  # epoch seconds at which the window frees a request


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """A caller let in: its identity (a digest of its key, or its address) and its rate window (None: no limit)."""

    identity: str
    window: Window | None = None


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


def matches(presented, keys):
    """Whether ``presented`` is one of ``keys``, in time that depends on neither."""
    candidate = presented.encode("utf-8", "surrogateescape")
    found = False
    for key in keys:  # every key, always: no early exit that would time which one matched
        found |= hmac.compare_digest(candidate, key)
    return found


def store_options(uri):
    """The rate-limit store's connection options: sub-second timeouts for Redis and Valkey, none for the others."""
    scheme = uri.partition("://")[0]
    if scheme.startswith(("redis", "valkey")):
        return {"socket_timeout": STORE_TIMEOUT_S, "socket_connect_timeout": STORE_TIMEOUT_S}
    return {}


class Gate:
    """Keys and rate limits by area, from :class:`serve.settings.Settings`; rejections counted in ``metrics``."""

    def __init__(self, settings, metrics=None, clock=time.monotonic):
        self.metrics = metrics
        self.api_keys = load_keys(settings.api_keys, settings.api_key_file)
        metrics_keys = load_keys(settings.metrics_keys, settings.metrics_key_file)
        self._every_key = self.api_keys + metrics_keys
        self.keys = {
            "api": self.api_keys,
            "form": self.api_keys if settings.form_needs_key else (),
            "metrics": metrics_keys or self.api_keys,
            "open": (),
        }
        self.limits = _limits({
            "api": settings.rate_limit_api or settings.rate_limit,
            "form": settings.rate_limit_form or settings.rate_limit,
            "metrics": settings.rate_limit,
            "open": settings.rate_limit_open,
        })
        self._clock = clock
        self._limiter = self._fallback = None
        self._failed_at = None
        if any(self.limits.values()):
            from limits.storage import storage_from_string

            self._limiter = _limiter(storage_from_string(settings.rate_limit_store, **store_options(settings.rate_limit_store)))
            self._fallback = _limiter(storage_from_string("memory://"))

    def guarded(self, area):
        """Whether ``area`` asks for anything: a key or a rate limit (an unguarded area costs nothing to admit)."""
        return bool(self.keys[area] or self.limits[area])

    def admit(self, caller, area):
        """:class:`Admitted`, or :class:`RateLimited` past the area's budget, or :class:`Unauthenticated` without a right key."""
        identity = self.identity(caller)
        window = self._spend(identity, area) if self.limits[area] else None
        keys = self.keys[area]
        if keys and not (caller.key is not None and matches(caller.key, keys)):
            reason = "missing_key" if caller.key is None else "wrong_key"
            self._reject(reason, area)
            raise Unauthenticated("this server needs an API key" if caller.key is None else "the API key is not valid",
                                  reason)
        return Admitted(identity, window)

    def identity(self, caller):
        """The rate-limit bucket's name: a digest of a valid key, else the caller's address."""
        if caller.key is not None and self._every_key and matches(caller.key, self._every_key):
            return "key:" + hashlib.sha256(caller.key.encode("utf-8")).hexdigest()[:16]
        return "addr:" + (caller.address or "unknown")

    def _spend(self, identity, area):
        """One request from ``identity``'s budget for ``area``; :class:`RateLimited` when one of its limits is spent."""
        limiter = self._store()
        try:
            return _hit(limiter, self.limits[area], area, identity, self._reject)
        except RateLimited:
            raise
        except Exception as e:  # the store went away: count in this process until it may be back
            log.warning("the rate-limit store failed (%s: %s); counting in memory for %g s", type(e).__name__, e,
                        STORE_RETRY_S)
            self._failed_at = self._clock()
            return _hit(self._fallback, self.limits[area], area, identity, self._reject)

    def _store(self):
        if self._failed_at is not None and self._clock() - self._failed_at < STORE_RETRY_S:
            return self._fallback
        return self._limiter

    def _reject(self, reason, area):
        if self.metrics is not None:
            self.metrics.rejections.labels(reason, area).inc()


def _limits(by_area):
    from limits import parse_many

    return {area: tuple(parse_many(text)) if text else () for area, text in by_area.items()}


def _limiter(storage):
    """The most exact strategy ``storage`` supports: a moving window, else a sliding window counter, else a fixed window."""
    from limits import strategies
    from limits.storage import MovingWindowSupport, SlidingWindowCounterSupport

    if isinstance(storage, MovingWindowSupport):
        return strategies.MovingWindowRateLimiter(storage)
    if isinstance(storage, SlidingWindowCounterSupport):
        return strategies.SlidingWindowCounterRateLimiter(storage)
    return strategies.FixedWindowRateLimiter(storage)


def _hit(limiter, items, area, identity, reject):
    """Spend one request on every limit of ``items``; the tightest window, or :class:`RateLimited` naming the spent limit."""
    tightest = None
    for item in items:
        if not limiter.hit(item, "serve", area, identity):
            stats = limiter.get_window_stats(item, "serve", area, identity)
            wait = max(1, int(stats.reset_time - time.time() + 0.999))
            reject("rate_limited", area)
            raise RateLimited(f"too many requests: the limit is {item}; retry after {wait} s", wait, str(item),
                              Window(item.amount, 0, stats.reset_time))
        stats = limiter.get_window_stats(item, "serve", area, identity)
        if tightest is None or stats.remaining < tightest.remaining:
            tightest = Window(item.amount, stats.remaining, stats.reset_time)
    return tightest
