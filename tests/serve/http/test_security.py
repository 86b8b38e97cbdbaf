"""serve.http.security against real gunicorn servers: API keys, rate limits (in memory and in a real Redis
shared by two workers), CORS, security headers, ProxyFix; then the client's key, the settings' errors,
and bandit over the shipped packages.

Three servers, one per configuration: the session's default one (everything off but the headers),
a secured one (keys, limits, CORS, a trusted proxy; one worker, so in-memory counts are exact) and
a two-worker one whose limits live in Redis.
"""

import base64
import concurrent.futures
import html.parser
import itertools
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

import raw_http
import synthetic
from fake_backend import FakeBackend
from live_server import access_messages, free_port, live_server, start_server, stop_server  # noqa: F401  (live_server: a fixture)

ROOT = pathlib.Path(__file__).resolve().parents[3]
REDIS_SERVER = shutil.which("redis-server")
CHROMIUM = "/usr/bin/chromium"

# Random keys, so that finding one in a log cannot be a coincidence.
ENV_KEY = "env-" + secrets.token_hex(12)
FILE_KEYS = ["file-" + secrets.token_hex(12) for _ in range(40)]
METRICS_KEY = "metrics-" + secrets.token_hex(12)
ALLOWED_ORIGIN = "https://app.example"
API_LIMIT = 5  # per client, for all API routes together, per minute, on the secured server
FORM_LIMIT = 2
SHARED_LIMIT = 6  # per minute, on the Redis-backed server


# -- servers --------------------------------------------------------------------------------


class Server(str):
    """A base URL that also knows its log folder."""

    logs: pathlib.Path


def _server(model_base, env, folder):
    """A gunicorn server over ``model_base`` with ``env``, whose logs are in ``folder``, for a fixture to yield."""
    process, url = start_server(model_base, env)
    server = Server(url)
    server.logs = folder
    yield server
    stop_server(process)


@pytest.fixture(scope="module")
def secured(model_base, tmp_path_factory):
    folder = tmp_path_factory.mktemp("secured")
    key_file = folder / "api-keys"
    key_file.write_text("# clients of the API\n" + "\n\n".join(FILE_KEYS) + "\n")
    env = {
        "SERVE_API_KEYS": f" {ENV_KEY} ,",
        "SERVE_API_KEY_FILE": str(key_file),
        "SERVE_METRICS_KEYS": METRICS_KEY,
        # Windows far longer than any test takes on a loaded machine; recovery is tested with a fake clock.
        "SERVE_RATE_LIMIT_API": f"{API_LIMIT} per minute",
        "SERVE_RATE_LIMIT_FORM": f"{FORM_LIMIT} per minute",
        "SERVE_CORS_ORIGINS": f"{ALLOWED_ORIGIN}, https://other.example",
        "SERVE_TRUSTED_PROXIES": "1",
        "WEB_CONCURRENCY": "1",
        # Everything gunicorn and the app log, at the most talkative level, into files the last test reads.
        "GUNICORN_CMD_ARGS": f"--access-logfile {folder}/access.log --error-logfile {folder}/error.log --log-level debug",
    }
    yield from _server(model_base, env, folder)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; scripts/test.sh installs it)")
    import redis

    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.1)
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def shared(model_base, redis_url, tmp_path_factory):
    folder = tmp_path_factory.mktemp("shared")
    env = {
        "SERVE_RATE_LIMIT_API": f"{SHARED_LIMIT} per minute",
        "SERVE_RATE_LIMIT_STORE": redis_url,
        "WEB_CONCURRENCY": "2",
        "GUNICORN_THREADS": "4",
        # One line per request naming the worker (pid) that answered it.
        "GUNICORN_CMD_ARGS": f"--access-logfile {folder}/access.log --access-logformat '%(p)s %(s)s %(U)s'",
    }
    yield from _server(model_base, env, folder)


# -- helpers --------------------------------------------------------------------------------

_fresh_keys = iter(FILE_KEYS)
_fresh_addresses = (f"203.0.113.{i}" for i in itertools.count(1))


def fresh_key():
    """A key no other test uses, so that each test has rate-limit buckets of its own."""
    return next(_fresh_keys)


def fresh_address():
    """A client address (sent as X-Forwarded-For through the trusted proxy) no other test uses."""
    return next(_fresh_addresses)


def call(url, method="GET", key=None, how="bearer", address=None, headers=None, **kwargs):
    headers = dict(headers or {})
    if key is not None:
        if how == "bearer":
            headers["Authorization"] = f"Bearer {key}"
        elif how == "x-api-key":
            headers["X-API-Key"] = key
        else:
            headers["Authorization"] = "Basic " + base64.b64encode(f"anyone:{key}".encode()).decode()
    if address is not None:
        headers["X-Forwarded-For"] = address
    return requests.request(method, url, headers=headers, timeout=30, **kwargs)


def png(seed=0):
    return synthetic.encode(synthetic.make_images(1, seed=seed)[0][0])


def assert_security_headers(response):
    h = response.headers
    assert h["X-Content-Type-Options"] == "nosniff"
    assert h["X-Frame-Options"] == "DENY"
    assert h["Referrer-Policy"] == "no-referrer"
    csp = h["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    if response.headers.get("Content-Type", "").startswith("text/html"):
        assert "script-src 'self'" in csp and "style-src 'self'" in csp and "img-src 'self' data:" in csp
    else:
        assert csp.startswith("default-src 'none'")


def rejections(url):
    """{(reason, area): count} from /metrics."""
    text = call(f"{url}/metrics", key=METRICS_KEY).text
    counts = {}
    for family in text_string_to_metric_families(text):
        if family.name == "serve_rejections":
            for sample in family.samples:
                if sample.name == "serve_rejections_total":
                    counts[(sample.labels["reason"], sample.labels["area"])] = sample.value
    return counts


# -- the default server: open, no limits, no CORS, headers everywhere -------------------------

ROUTES = [
    ("GET", "/", {}, 200),
    ("POST", "/", {"files": {"file": ("", b"")}}, 400),
    ("GET", "/static/form.css", {}, 200),
    ("GET", "/api/v1/model", {}, 200),
    ("POST", "/api/v1/predict", {"files": {"file": ("a.png", png())}}, 200),
    ("POST", "/api/v1/predict", {"data": b"raw", "headers": {"Content-Type": "application/octet-stream"}}, 400),
    ("GET", "/api/v1/predict", {}, 405),
    ("GET", "/api/v1/nothing", {}, 404),
    ("GET", "/nothing", {}, 404),
    ("GET", "/v1/models/cifar10", {}, 200),
    ("GET", "/v1/models/cifar10/metadata", {}, 200),
    ("GET", "/v1/models/other", {}, 404),
    ("GET", "/healthz", {}, 200),
    ("GET", "/readyz", {}, 200),
    ("GET", "/metrics", {}, 200),
]


@pytest.mark.end_to_end
@pytest.mark.parametrize("method, path, kwargs, status", ROUTES, ids=[f"{m} {p} {s}" for m, p, _, s in ROUTES])
def test_default_server_is_open_and_sends_security_headers_everywhere(live_server, method, path, kwargs, status):  # noqa: F811
    response = call(f"{live_server}{path}", method, **kwargs)
    assert response.status_code == status
    assert_security_headers(response)
    assert "X-RateLimit-Limit" not in response.headers  # no limits unless configured
    assert "WWW-Authenticate" not in response.headers


@pytest.mark.end_to_end
def test_default_server_has_no_cors(live_server):  # noqa: F811
    simple = call(f"{live_server}/api/v1/model", headers={"Origin": ALLOWED_ORIGIN})
    assert simple.status_code == 200 and "Access-Control-Allow-Origin" not in simple.headers
    preflight = call(
        f"{live_server}/api/v1/predict",
        "OPTIONS",
        headers={"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"},
    )
    assert not any(name.startswith("Access-Control-Allow") for name in preflight.headers)


class _InlineFinder(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "style" or (tag == "script" and not attrs.get("src")):
            self.found.append(f"<{tag}> element")
        self.found += [f"{name}= on <{tag}>" for name in attrs if name == "style" or name.startswith("on")]


@pytest.mark.end_to_end
def test_pages_hold_no_inline_script_or_style(live_server):  # noqa: F811
    form = call(f"{live_server}/")
    results = call(f"{live_server}/", "POST", files=[("file", ("a.png", png(1))), ("file", ("b.txt", b"text"))])
    assert results.status_code == 200 and 'class="fill"' in results.text  # a results page, with its bars
    for page in (form, results):
        finder = _InlineFinder()
        finder.feed(page.text)
        assert finder.found == []
    css = call(f"{live_server}/static/form.css")
    assert css.headers["Content-Type"].startswith("text/css") and ".bar .fill" in css.text


@pytest.mark.end_to_end
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (apt-get install chromium)")
def test_results_page_renders_under_its_csp_in_chromium(live_server, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    path = tmp_path / "a.png"
    path.write_bytes(png(2))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            console = []
            page.on("console", lambda message: console.append(message.text))
            page.goto(f"{live_server}/")
            page.set_input_files("input[type=file]", str(path))
            page.click("button[type=submit]")
            page.wait_for_selector("[data-testid=label]")
            # The style sheet applied (a CSP refusal would leave the browser's defaults) ...
            assert page.evaluate("getComputedStyle(document.querySelector('form')).borderTopStyle") == "solid"
            assert page.evaluate("document.querySelector('.bar .fill').getBoundingClientRect().width") > 200
            assert page.evaluate("document.querySelector('.result img').naturalWidth") == 32  # data: image allowed
            # ... and the browser refused nothing.
            assert not [m for m in console if "Content Security Policy" in m or "Refused" in m]
        finally:
            browser.close()


# -- the secured server: API keys -----------------------------------------------------------

PROTECTED = [
    ("GET", "/api/v1/model"),
    ("POST", "/api/v1/predict"),
    ("GET", "/api/v1/nothing"),  # unknown routes too: nothing to learn without a key
    ("GET", "/v1/models/cifar10"),
    ("POST", "/v1/models/cifar10:predict"),
    ("GET", "/v2"),  # the KServe v2 protocol's routes, by prefix
    ("GET", "/v2/models/cifar10"),
    ("POST", "/v2/models/cifar10/infer"),
]


@pytest.mark.end_to_end
@pytest.mark.parametrize("method, path", PROTECTED)
def test_missing_key_is_401_json_with_a_bearer_challenge(secured, method, path):
    response = call(f"{secured}{path}", method, address=fresh_address(), json={"instances": [1]})
    assert response.status_code == 401
    assert "API key" in response.json()["error"]
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="serve"'
    assert_security_headers(response)


@pytest.mark.end_to_end
@pytest.mark.parametrize("how", ["bearer", "x-api-key", "basic"])
def test_wrong_key_is_401_invalid_token(secured, how):
    wrong = FILE_KEYS[0][:-1] + ("0" if FILE_KEYS[0][-1] != "0" else "1")  # one character off
    for path in ("/api/v1/model", "/v1/models/cifar10"):
        response = call(f"{secured}{path}", key=wrong, how=how, address=fresh_address())
        assert response.status_code == 401
        # The error and the request's id (serve/telemetry/logs.py), nothing else: no word of which key was near.
        assert response.json() == {"error": "the API key is not valid", "request_id": response.headers["X-Request-Id"]}
        assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]


@pytest.mark.end_to_end
def test_keys_from_the_variable_and_the_file_each_way_open_the_api(secured):
    for key, how in [(ENV_KEY, "bearer"), (fresh_key(), "x-api-key"), (fresh_key(), "basic")]:
        info = call(f"{secured}/api/v1/model", key=key, how=how)
        assert info.status_code == 200 and info.json()["name"] == "cifar10"
        assert_security_headers(info)
    key = fresh_key()
    predicted = call(f"{secured}/api/v1/predict", "POST", key=key, files={"file": ("a.png", png())})
    assert predicted.status_code == 200 and predicted.json()["predictions"][0]["label"] in synthetic.CLASS_NAMES
    tfs = call(f"{secured}/v1/models/cifar10:predict", "POST", key=key, json={"instances": synthetic.make_images(1)[0][:1].tolist()})
    assert tfs.status_code == 200 and len(tfs.json()["predictions"]) == 1


@pytest.mark.end_to_end
def test_health_readiness_and_static_files_stay_open(secured):
    for path in ("/healthz", "/readyz", "/static/form.css"):
        response = call(f"{secured}{path}")
        assert response.status_code == 200, path
        assert "X-RateLimit-Limit" not in response.headers  # and never rate limited
        assert_security_headers(response)


@pytest.mark.end_to_end
def test_form_asks_the_browser_for_the_key(secured):
    address = fresh_address()
    refused = call(f"{secured}/", address=address)
    assert refused.status_code == 401
    assert refused.headers["WWW-Authenticate"].startswith('Basic realm="serve"')
    assert refused.headers["Content-Type"].startswith("text/html") and "needs an API key" in refused.text
    assert_security_headers(refused)
    page = call(f"{secured}/", key=fresh_key(), how="basic")
    assert page.status_code == 200 and 'type="file"' in page.text


@pytest.mark.end_to_end
def test_metrics_have_their_own_keys_and_count_rejections(secured):
    assert call(f"{secured}/metrics", address=fresh_address()).status_code == 401
    assert call(f"{secured}/metrics", key=ENV_KEY).status_code == 401  # an API key opens no metrics
    assert call(f"{secured}/api/v1/model", key=METRICS_KEY).status_code == 401  # nor a metrics key the API
    before = rejections(secured)
    call(f"{secured}/api/v1/model", address=fresh_address())
    call(f"{secured}/api/v1/model", key="not-a-key", address=fresh_address())
    key = fresh_key()
    statuses = [call(f"{secured}/api/v1/model", key=key).status_code for _ in range(API_LIMIT + 1)]
    assert statuses[-1] == 429
    after = rejections(secured)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert delta[("missing_key", "api")] == 1
    assert delta[("wrong_key", "api")] == 1
    assert delta[("rate_limited", "api")] == 1
    assert after[("missing_key", "metrics")] >= 1 and after[("wrong_key", "metrics")] >= 1


# -- the secured server: rate limits ----------------------------------------------------------


@pytest.mark.end_to_end
def test_limit_is_one_budget_per_client_for_every_api_route(secured):
    key = fresh_key()
    pixels = {"instances": synthetic.make_images(1, seed=3)[0].tolist()}
    b64 = {"instances": [{"b64": base64.b64encode(png()).decode()}]}
    spent = [
        call(f"{secured}/api/v1/model", key=key).status_code,
        call(f"{secured}/api/v1/predict", "POST", key=key, json=b64).status_code,
        call(f"{secured}/v1/models/cifar10:predict", "POST", key=key, json=pixels).status_code,
        call(f"{secured}/v1/models/cifar10", key=key).status_code,
        call(f"{secured}/v2/models/cifar10", key=key).status_code,
    ]
    assert spent == [200] * API_LIMIT  # five routes, one call each: the budget is spent
    for method, path, body in [
        ("GET", "/api/v1/model", None), ("POST", "/api/v1/predict", b64),
        ("POST", "/v1/models/cifar10:predict", pixels), ("GET", "/v2/health/ready", None),
    ]:
        refused = call(f"{secured}{path}", method, key=key, json=body)
        assert refused.status_code == 429, path  # every route of the area: no route has a count of its own
    assert "too many requests" in refused.json()["error"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["X-RateLimit-Limit"] == str(API_LIMIT) and refused.headers["X-RateLimit-Remaining"] == "0"
    assert_security_headers(refused)
    assert call(f"{secured}/api/v1/model", key=fresh_key()).status_code == 200  # another client: its own count
    assert call(f"{secured}/", key=key, how="basic").status_code == 200  # the form: its own budget


@pytest.mark.end_to_end
def test_the_image_cap_holds_through_gunicorn_on_every_route(secured):
    key = fresh_key()
    pixels = np.zeros((257, 32, 32, 3), np.uint8)
    b64 = [{"b64": base64.b64encode(png()).decode()}] * 257
    for path, body in [
        ("/api/v1/predict", {"instances": b64}),
        ("/v1/models/cifar10:predict", {"instances": pixels.tolist()}),
        ("/v2/models/cifar10/infer", {"inputs": [{"name": "images", "datatype": "UINT8", "shape": list(pixels.shape),
                                                  "data": pixels.ravel().tolist()}]}),
    ]:
        refused = call(f"{secured}{path}", "POST", key=key, json=body)
        assert refused.status_code == 413, (path, refused.text[:200])
        assert "at most 256 per request" in refused.json()["error"]
        key = fresh_key()  # each route with a budget of its own client, so the limit is not what answers


@pytest.mark.end_to_end
@pytest.mark.parametrize("size", [200_000, 900_000])
def test_a_refused_body_leaves_the_connection_usable(secured, size):
    """A 401 answers before the body is read; the connection it announced as kept alive must stay so.

    gunicorn drains at most 64 KiB of an unread body and closes the connection when there is more,
    after an answer that said keep-alive: the client's next request on it then finds it gone.
    """
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(secured)
    body = b"x" * size
    head = (f"POST /api/v1/predict HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((where.hostname, where.port), timeout=60) as sock:
        sock.sendall(head + body)
        first = _read_response(sock)
        assert first.startswith(b"HTTP/1.1 401") and b"connection: close" not in first.lower()
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {where.netloc}\r\n\r\n".encode())
        second = _read_response(sock)
        assert second.startswith(b"HTTP/1.1 200"), second[:200]


def _read_response(sock):
    """One whole HTTP/1.1 response with a Content-Length (b"" if the server closed the connection)."""
    data = raw_http.receive_until(sock, lambda data: b"\r\n\r\n" in data)
    if b"\r\n\r\n" not in data:
        return data
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    rest = raw_http.receive_until(sock, lambda rest: len(rest) >= length, rest)
    return head + b"\r\n\r\n" + rest


def test_a_limit_recovers_when_its_window_has_passed(monkeypatch):
    """In-process, on a fake clock: the open routes' limit (SERVE_RATE_LIMIT_OPEN) refuses, then lets through."""
    import types

    import limits.storage.memory
    from serve import create_app

    offset = [0.0]
    real = limits.storage.memory.time
    monkeypatch.setattr(limits.storage.memory, "time", types.SimpleNamespace(time=lambda: real.time() + offset[0]))
    app = create_app({"MODEL_NAME": "cifar10", "RATE_LIMIT_OPEN": "2 per 10 seconds"}, backend=_BrokenBackend())
    client = app.test_client()
    assert [client.get("/healthz").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/readyz").status_code == 429  # /healthz and /readyz share the open area's budget
    offset[0] += 5
    assert client.get("/healthz").status_code == 429  # half the window: still refused
    offset[0] += 6
    assert client.get("/healthz").status_code == 200


@pytest.mark.end_to_end
def test_clients_without_a_key_are_limited_by_address_through_the_proxy(secured):
    address = fresh_address()
    url = f"{secured}/api/v1/model"
    statuses = [call(url, key="guess-" + str(i), address=address).status_code for i in range(API_LIMIT + 1)]
    assert statuses == [401] * API_LIMIT + [429]  # key guessing is limited too
    # ProxyFix believes only the proxy's own (rightmost) entry: a client's made-up one changes nothing.
    assert call(url, key="guess", headers={"X-Forwarded-For": f"198.51.100.7, {address}"}).status_code == 429
    assert call(url, key="guess", address=fresh_address()).status_code == 401  # another address: not yet


@pytest.mark.end_to_end
def test_form_over_its_limit_is_a_readable_page(secured):
    key = fresh_key()
    for _ in range(FORM_LIMIT):
        assert call(f"{secured}/", "POST", key=key, how="basic", files={"file": ("a.png", png())}).status_code == 200
    refused = call(f"{secured}/", "POST", key=key, how="basic", files={"file": ("a.png", png())})
    assert refused.status_code == 429
    assert refused.headers["Content-Type"].startswith("text/html")
    assert re.search(r'role="alert">Too many requests from you: the limit is 2 per 1 minute.*Try again in \d+ s', refused.text)
    assert int(refused.headers["Retry-After"]) >= 1
    assert_security_headers(refused)


# -- the secured server: hostile input with keys on ---------------------------------------------


@pytest.mark.end_to_end
def test_hostile_input_with_a_key_gets_its_usual_4xx_and_without_one_a_401(secured):
    cases = [
        ({"files": {"file": ("x.txt", b"text")}}, 400, "x.txt"),
        ({"data": b'{"instances": [', "headers": {"Content-Type": "application/json"}}, 400, "JSON"),
        ({"files": {"file": ("big.png", b"\0" * (17 * 1024 * 1024))}}, 413, "limit"),
        ({"data": b"garbage", "headers": {"Content-Type": "multipart/form-data; boundary=b"}}, 400, "malformed"),
    ]
    key = fresh_key()
    for kwargs, status, words in cases:
        response = call(f"{secured}/api/v1/predict", "POST", key=key, **kwargs)
        assert response.status_code == status and words in response.json()["error"]
        assert_security_headers(response)
    for kwargs, _, _ in cases[:2] + cases[3:]:
        response = call(f"{secured}/api/v1/predict", "POST", address=fresh_address(), **kwargs)
        assert response.status_code == 401
    assert call(f"{secured}/healthz").status_code == 200  # and the server is still up


# -- the secured server: CORS -------------------------------------------------------------------


def preflight(url, origin):
    return call(
        f"{url}/api/v1/predict",
        "OPTIONS",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"},
    )


@pytest.mark.end_to_end
def test_cors_allows_the_listed_origins(secured):
    allowed = preflight(secured, ALLOWED_ORIGIN)  # preflights carry no key, and need none
    assert allowed.status_code == 200
    assert allowed.headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN
    assert "authorization" in allowed.headers["Access-Control-Allow-Headers"].lower()
    assert allowed.headers["Access-Control-Allow-Methods"] == "GET, POST"
    unlisted = call(
        f"{secured}/api/v1/predict",
        "OPTIONS",
        headers={"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-something-else"},
    )
    assert "Access-Control-Allow-Headers" not in unlisted.headers  # only the headers the API reads
    response = call(f"{secured}/api/v1/model", key=fresh_key(), headers={"Origin": ALLOWED_ORIGIN})
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN
    assert "Origin" in response.headers["Vary"]
    assert "Retry-After" in response.headers["Access-Control-Expose-Headers"]
    refused = call(f"{secured}/api/v1/model", address=fresh_address(), headers={"Origin": ALLOWED_ORIGIN})
    assert refused.status_code == 401 and refused.headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN  # readable


@pytest.mark.end_to_end
def test_cors_refuses_other_origins(secured):
    for origin in ("https://evil.example", "https://app.example.evil.example", "null"):
        assert "Access-Control-Allow-Origin" not in preflight(secured, origin).headers
        response = call(f"{secured}/api/v1/model", key=fresh_key(), headers={"Origin": origin})
        assert response.status_code == 200 and "Access-Control-Allow-Origin" not in response.headers
    page = call(f"{secured}/", key=fresh_key(), how="basic", headers={"Origin": ALLOWED_ORIGIN})
    assert "Access-Control-Allow-Origin" not in page.headers  # only the API is shared, never the form


# -- the client sends the key -------------------------------------------------------------------


@pytest.mark.end_to_end
def test_client_sends_its_key_from_the_environment_or_the_flag(secured, tmp_path, monkeypatch, capsys):
    from client import cli

    image = tmp_path / "a.png"
    image.write_bytes(png())
    monkeypatch.delenv(cli.API_KEY_ENV, raising=False)
    assert cli.main(["info", "--url", secured]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "needs an API key" in err and cli.API_KEY_ENV in err
    wrong = "wrong-" + secrets.token_hex(4)
    assert cli.main(["predict", str(image), "--url", secured, "--api-key", wrong]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "not valid" in err and wrong not in err and err.count("\n") == 1  # one line, no key echoed
    assert cli.main(["predict", str(image), "--url", secured, "--api-key", fresh_key(), "--json"]) == cli.EXIT_OK
    assert '"label"' in capsys.readouterr().out
    monkeypatch.setenv(cli.API_KEY_ENV, fresh_key())
    assert cli.main(["info", "--url", secured]) == cli.EXIT_OK
    assert "cifar10" in capsys.readouterr().out
    assert cli.main(["predict", str(image), "--url", secured, "--via", "tfserving-rest", "--json"]) == cli.EXIT_OK


# -- the secured server: nothing logged ------------------------------------------------------------


@pytest.mark.end_to_end
def test_keys_never_reach_the_logs(secured):
    """Runs last in this module, after every key has been sent, right and wrong, every way."""
    marker = secrets.token_hex(8)  # in the request line, which the access log shows
    call(f"{secured}/api/v1/model?last={marker}", key=ENV_KEY + "x", address=fresh_address())  # a wrong key, for good measure
    deadline = time.monotonic() + 30  # gunicorn writes its access log line after the answer
    while marker not in (access := (secured.logs / "access.log").read_text()):
        assert time.monotonic() < deadline, "the last request never reached the access log"
        time.sleep(0.1)
    errors = (secured.logs / "error.log").read_text()
    assert "/api/v1/model" in access and "Booting worker" in errors  # the logs are really written
    for key in [ENV_KEY, METRICS_KEY, *FILE_KEYS]:
        assert key not in access and key not in errors


# -- two workers, one Redis ---------------------------------------------------------------------


@pytest.mark.end_to_end
def test_redis_limit_is_shared_by_two_workers(shared, redis_url):
    import redis

    def one(_):
        return requests.get(f"{shared}/api/v1/model", headers={"Connection": "close"}, timeout=30).status_code

    statuses, workers = [], set()
    deadline = time.monotonic() + 120
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        # Until both workers have answered (the kernel picks which one accepts each connection):
        # the count is one for both whichever answered, so more rounds only add 429s.
        while len(workers) < 2 and time.monotonic() < deadline:
            statuses += pool.map(one, range(16))
            lines = access_messages((shared.logs / "access.log").read_text())
            workers = {line.split()[0] for line in lines if line.endswith("/api/v1/model")}
    assert len(workers) == 2, "one worker answered everything; the test proves nothing"
    assert statuses.count(200) == SHARED_LIMIT  # one count for both workers, not one each
    assert statuses.count(429) == len(statuses) - SHARED_LIMIT
    assert any(b"serve" in key for key in redis.Redis.from_url(redis_url).keys("*"))


# -- in-process: errors, settings, comparisons ----------------------------------------------------


class _BrokenBackend:
    kind = "broken"
    loaded = True

    def ready(self):
        return 1

    def info(self):
        raise RuntimeError("the backend broke")

    def close(self):
        pass


def test_a_500_carries_the_headers_too():
    from serve import create_app

    app = create_app({"MODEL_NAME": "cifar10", "API_KEYS": "k"}, backend=_BrokenBackend())
    response = app.test_client().get("/api/v1/model", headers={"X-API-Key": "k"})
    assert response.status_code == 500 and response.get_json()["error"]
    assert_security_headers(response)


@pytest.mark.parametrize(
    "config, words",
    [
        ({"API_KEY_FILE": "/nonexistent/keys"}, "cannot read the key file"),
        ({"METRICS_KEY_FILE": "EMPTY"}, "holds no key"),
        ({"RATE_LIMIT_API": "lots"}, "is not a rate limit"),
    ],
    ids=["missing-key-file", "empty-key-file", "bad-limit"],
)
def test_bad_security_settings_stop_the_start(tmp_path, config, words):
    from serve import create_app

    empty = tmp_path / "empty"
    empty.write_text("# no keys yet\n\n")
    config = {k: (str(empty) if v == "EMPTY" else v) for k, v in config.items()}
    with pytest.raises((RuntimeError, ValueError), match=words):
        create_app({"MODEL_NAME": "cifar10", **config}, backend=_BrokenBackend())


def test_settings_from_the_environment():
    from serve.settings import Settings

    off = Settings.from_env({})
    assert (off.api_keys, off.rate_limit, off.cors_origins, off.trusted_proxies) == ("", "", "", 0)
    assert off.form_needs_key is True and off.rate_limit_store == "memory://"
    on = Settings.from_env({"SERVE_FORM_NEEDS_KEY": "0", "SERVE_RATE_LIMIT_STORE": "redis://r:6379/1", "SERVE_TRUSTED_PROXIES": "2"})
    assert on.form_needs_key is False and on.rate_limit_store == "redis://r:6379/1" and on.trusted_proxies == 2


def test_a_key_is_compared_with_every_key_in_constant_time(monkeypatch):
    from serve.core import admission

    compared = []
    real = admission.hmac.compare_digest
    monkeypatch.setattr(admission.hmac, "compare_digest", lambda a, b: compared.append(b) or real(a, b))
    keys = admission.load_keys("first, second,third", None)
    assert admission.matches("first", keys) and not admission.matches("fourth", keys)
    assert compared == list(keys) * 2  # no early exit on a match


def test_form_can_be_left_open_while_the_api_needs_a_key():
    from serve import create_app

    app = create_app({"MODEL_NAME": "cifar10", "API_KEYS": "k", "FORM_NEEDS_KEY": False}, backend=_BrokenBackend())
    client = app.test_client()
    assert client.get("/").status_code == 200
    assert client.get("/api/v1/model").status_code == 401


def test_metrics_take_the_api_keys_when_they_have_none_of_their_own():
    from serve import create_app

    client = create_app({"MODEL_NAME": "cifar10", "API_KEYS": "k"}, backend=FakeBackend()).test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"X-API-Key": "k"}).status_code == 200
    open_server = create_app({"MODEL_NAME": "cifar10"}, backend=FakeBackend()).test_client()
    assert open_server.get("/metrics").status_code == 200  # no keys at all: open, as before


# -- static analysis ---------------------------------------------------------------------------

SHIPPED = ["contract", "tfs_protos", "train", "export", "serve", "client"]  # the packages pyproject.toml installs


def test_bandit_finds_nothing_in_the_shipped_packages():
    result = subprocess.run(
        [sys.executable, "-m", "bandit", "-r", *SHIPPED, "-x", "tfs_protos", "-f", "json", "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    import json

    report = json.loads(result.stdout)
    findings = [f"{r['filename']}:{r['line_number']} {r['test_id']} {r['issue_text']}" for r in report["results"]]
    assert findings == [], "fix these, or justify each inline: '# nosec BNNN  # why'"
    assert report["errors"] == []


def test_every_nosec_names_its_test_and_says_why():
    for package in SHIPPED:
        for source in (ROOT / package).rglob("*.py"):
            if "tfs_protos" in source.parts:
                continue
            lines = source.read_text().splitlines()
            for number, line in enumerate(lines):
                if "# nosec" not in line:
                    continue
                where = f"{source.relative_to(ROOT)}:{number + 1}"
                assert re.search(r"# nosec B\d{3}(,B\d{3})*\b", line), f"{where}: name the bandit test"
                reason_inline = re.search(r"# nosec B[\d,B]+\s+#\s*\S", line)
                reason_above = number > 0 and lines[number - 1].strip().startswith("#")
                assert reason_inline or reason_above, f"{where}: say why, inline or on the line above"
