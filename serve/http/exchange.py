"""One HTTP exchange, from arrival to answer: the request's id and clock, its admission, and what its answer carries.

Every request gets, in one hook before its view and one after (every answer, refusals and errors included):

* **an id**: the caller's ``X-Request-Id`` when it is sane, else a new one (:func:`serve.telemetry.logs.new_id`), echoed
  in the answer, added to every JSON error body (``"request_id"``) and to every log line written meanwhile;
* **admission**: the core's gate for the path's area (:meth:`serve.http.security.Security.admit`), before the body is read;
* **metrics**: in flight while it runs (``serve_in_flight_requests``), then counted and timed by route, method and
  status (labels from fixed sets: a client that invents paths or methods adds no series);
* **headers**: the security headers, ``Cache-Control``, ``Vary``, the rate limit's window
  (:meth:`serve.http.security.Security.headers`) and ``X-Model-Version``, the version that answered;
* **a refused body drained** (:func:`serve.http.bodies.drain_refused_body`), so that its connection stays usable;
* **one access line** (``serve.access``): the id, method, route, status, model version and images answered, the
  duration and the client's address. No line carries an API key, a header or an image's bytes.

The work is done once per exchange, in one place, reading the request's environ once: this is the hot path of
every request (docs/benchmarks.md counts its instructions).
"""

import logging
import time

from flask import g, request

from serve.http import bodies
from serve.http.security import OPEN_PREFIXES, area_of
from serve.telemetry import logs, tracing
from serve.telemetry.metrics import METHODS

#: The request header the caller's id comes in, and the answer's header it goes back in.
REQUEST_ID = logs.HEADER
#: The model version that answered the request, on every answer a model gave.
MODEL_VERSION = logs.VERSION_HEADER


def init_app(app, security, metrics):
    """Install the exchange's hooks on ``app``: ``security`` (:class:`serve.http.security.Security`), ``metrics``."""
    in_flight = metrics.in_flight
    access = logs.ACCESS
    json = app.json

    @app.before_request
    def arrive():
        req, state = request._get_current_object(), g._get_current_object()
        state.serve_started = time.monotonic()
        state.request_id = rid = logs.new_id(req.environ.get("HTTP_X_REQUEST_ID", ""))
        tracing.tag(rid)  # onto the request's span, when traces are on
        in_flight.inc()
        state.serve_in_flight = True
        state.serve_area = area = area_of(req.path)
        security.admit(area)

    @app.after_request
    def answer(response):
        req, state = request._get_current_object(), g._get_current_object()
        path = req.path
        area = getattr(state, "serve_area", None) or area_of(path)
        security.headers(response, area, path.startswith(OPEN_PREFIXES))
        headers = response.headers
        rid = getattr(state, "request_id", None)
        if rid is None:  # refused before the hooks ran
            rid = state.request_id = logs.new_id(None)
        status = response.status_code
        if status >= 400:
            bodies.drain_refused_body(response)
            if response.is_json:
                body = response.get_json(silent=True)
                if isinstance(body, dict) and "error" in body and "request_id" not in body:
                    body["request_id"] = rid
                    response.set_data(json.dumps(body))
        version, images = getattr(state, "serve_answered", None) or (None, 0)
        headers.add(REQUEST_ID, rid)
        if version is not None:  # which version answered, on every protocol (TF Serving's REST body has no field for it)
            headers.add(MODEL_VERSION, str(version))
        rule, method = req.url_rule, req.method
        route = rule.rule if rule is not None else "<unmatched>"
        started = getattr(state, "serve_started", None)
        seconds = None if started is None else time.monotonic() - started
        metrics.request_answered(route, method if method in METHODS else "other", status, seconds)
        if access.isEnabledFor(logging.INFO):
            access.info("%s %s %s", method, route if rule is not None else logs.printable(path), status, extra={
                "request_id": rid, "method": method, "route": route, "status": status, "model_version": version,
                "images": images, "duration_ms": None if seconds is None else round(seconds * 1000, 2),
                "client": req.remote_addr,
            })
        return response

    @app.teardown_request
    def leave(_error):
        if g.pop("serve_in_flight", False):
            in_flight.dec()
