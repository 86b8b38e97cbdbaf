"""The image's proxy mode for real: Debian's nginx with deploy/nginx/nginx.conf in front of a live gunicorn.

Only the two ports of the config are moved (tests/support/proxy.py); its paths stay relative to
``-p``, a temporary folder here, ``/tmp/`` in the image. nginx's error log is kept beside the others. The server runs one worker of 4 threads,
so 16 clients trickling their bodies would hold every thread if anything but nginx held them.
Skipped only where Debian's ``nginx`` is missing (scripts/test.sh installs it).
"""

import http.client
import json
import select
import socket
import threading
import time

import pytest

import proxy
import raw_http
import synthetic
from live_server import free_port, start_server, stop_server

pytestmark = pytest.mark.skipif(proxy.nginx_binary() is None, reason="Debian's nginx is not installed (scripts/test.sh installs it)")

THREADS = 4
SLOW_CLIENTS = 4 * THREADS
DEADLINE_S = 60  # generous: the machine is shared; nothing here waits for a deadline to pass
PREDICT = "/v1/models/cifar10:predict"


@pytest.fixture(scope="module")
def stack(model_base, tmp_path_factory):
    """(nginx's port, the server's log file, nginx's access log file): nginx in front of gunicorn."""
    folder = tmp_path_factory.mktemp("proxy")
    server_log, nginx_log = folder / "serve.log", folder / "nginx-access.log"
    with open(server_log, "wb") as server_err, open(nginx_log, "wb") as nginx_out, open(folder / "nginx-error.log", "wb") as nginx_err:
        process, url = start_server(model_base, {"WEB_CONCURRENCY": "1", "GUNICORN_THREADS": str(THREADS),
                                                 "SERVE_TRUSTED_PROXIES": "1", "SERVE_LOG_FORMAT": "json"}, stderr=server_err)
        port = free_port()
        nginx = proxy.start(port, int(url.rpartition(":")[2]), stdout=nginx_out, stderr=nginx_err)
        try:
            yield port, server_log, nginx_log
        finally:
            proxy.stop(nginx)
            stop_server(process)


def predict_body():
    images, _ = synthetic.make_images(1)
    return json.dumps({"instances": images[:1].tolist()}).encode()


def request(port, method, path, body=None, headers=None, source="127.0.0.1"):
    """(status, headers, body) of one request to nginx from the loopback address ``source``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S, source_address=(source, 0))
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def log_line(path, request_id, logger):
    """The JSON line of ``logger`` in the log file ``path`` for ``request_id``, polled for until the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("logger") == logger and record.get("request_id") == request_id:
                    return record
        time.sleep(0.1)
    raise AssertionError(f"no {logger} line for {request_id} in {path.name} within {DEADLINE_S} s")


def answer(sock):
    """The status code and body of the whole HTTP answer on ``sock`` (nginx closes after it).

    A refusal (413) may end in a reset rather than a close: nginx answers before the body it
    refused has arrived, and closes with what did arrive unread. The answer came first."""
    sock.settimeout(DEADLINE_S)
    data = raw_http.receive_all(sock, ended_by=ConnectionResetError)
    assert b"\r\n\r\n" in data, f"the connection ended before the answer: {data[:200]!r}"
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), head.decode("latin-1"), body


def test_normal_requests_answer_while_more_slow_clients_than_threads_hold_their_connections(stack):
    port, _, _ = stack
    body = b'{"instances": []}'
    length = 100_000
    body += b" " * (length - len(body))
    head = (f"POST {PREDICT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()
    slow = [socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) for _ in range(SLOW_CLIENTS)]
    sent = [0] * SLOW_CLIENTS
    stop = threading.Event()

    def trickle():
        # A byte a client every half second: well inside nginx's client_body_timeout (10 s).
        while not stop.is_set():
            for i, sock in enumerate(slow):
                sock.sendall(body[sent[i]:sent[i] + 1])
                sent[i] += 1
            stop.wait(0.5)

    try:
        for sock in slow:
            sock.sendall(head)
        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        good = predict_body()
        for _ in range(2 * THREADS):
            status, headers, text = request(port, "POST", PREDICT, good, {"Content-Type": "application/json"})
            assert status == 200, text[:300]
            assert len(json.loads(text)["predictions"]) == 1
        # Every slow client is still connected and unanswered: nginx holds them, gunicorn never saw them.
        readable, _, _ = select.select(slow, [], [], 0)
        assert readable == [], "nginx answered or closed a client that was still sending"
    finally:
        stop.set()
    trickler.join(DEADLINE_S)
    # Finished, each held request reaches the server and gets its answer (an empty batch is a 400).
    for i, sock in enumerate(slow):
        sock.sendall(body[sent[i]:])
    for sock in slow:
        with sock:
            status, headers, text = answer(sock)
            assert status == 400, headers
            assert "x-model-version" not in headers.lower() and "error" in json.loads(text)


def test_a_body_over_the_servers_limit_is_refused_by_nginx(stack):
    from serve.settings import Settings

    port, _, nginx_log = stack
    limit = Settings().max_upload_bytes
    assert proxy.size_bytes(proxy.directives("client_max_body_size")[0]) == limit
    # Over the limit: refused from the header alone, before a byte of body or a word to gunicorn.
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as sock:
        sock.sendall((f"POST {PREDICT} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: too-large-1\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {limit + 1}\r\n\r\n").encode())
        status, headers, text = answer(sock)
    assert status == 413
    assert json.loads(text) == {"error": f"the request is larger than the {limit >> 20} MiB limit", "request_id": "too-large-1"}
    assert log_line(nginx_log, "too-large-1", "nginx.access")["upstream_s"] == ""  # never passed on
    # At the limit exactly, nginx passes it on, and the server does not call it too large either.
    status, headers, text = request(port, "POST", PREDICT, b" " * limit, {"Content-Type": "application/json",
                                                                           "X-Request-Id": "at-limit-1"})
    assert status == 400, text[:300]
    assert headers["X-Request-Id"] == "at-limit-1"


def test_the_client_address_and_request_id_reach_the_servers_log(stack):
    port, server_log, nginx_log = stack
    # A forged X-Forwarded-For is left of the address nginx saw, and SERVE_TRUSTED_PROXIES=1 believes one entry.
    status, headers, _ = request(port, "GET", "/api/v1/model", headers={"X-Request-Id": "proxied-1",
                                                                        "X-Forwarded-For": "203.0.113.7"}, source="127.0.0.2")
    assert status == 200 and headers["X-Request-Id"] == "proxied-1"
    assert log_line(server_log, "proxied-1", "serve.access")["client"] == "127.0.0.2"
    assert log_line(nginx_log, "proxied-1", "nginx.access")["client"] == "127.0.0.2"
    # No id, or one the server would not keep: nginx's own, the same in both logs and the answer.
    for given in ({}, {"X-Request-Id": "not a sane id!"}):
        status, headers, _ = request(port, "GET", "/healthz", headers=given)
        rid = headers["X-Request-Id"]
        assert status == 200 and len(rid) == 32 and int(rid, 16) >= 0
        assert log_line(server_log, rid, "serve.access")["route"] == "/healthz"
        assert log_line(nginx_log, rid, "nginx.access")["status"] == 200


def test_health_routes_pass_through(stack):
    port, _, _ = stack
    for path in ("/healthz", "/readyz"):
        status, headers, text = request(port, "GET", path)
        assert status == 200, (path, text[:200])
        assert "X-Request-Id" in headers


def test_a_server_that_does_not_answer_is_a_503_in_json(tmp_path):
    # nginx alone, in front of a port nothing listens on: its own refusal, 503 with Retry-After, as the server's.
    port = free_port()
    with open(tmp_path / "nginx-access.log", "wb") as out, open(tmp_path / "nginx-error.log", "wb") as err:
        nginx = proxy.start(port, free_port(), stdout=out, stderr=err)
    try:
        status, headers, text = request(port, "POST", PREDICT, predict_body(), {"Content-Type": "application/json",
                                                                                "X-Request-Id": "down-1"})
    finally:
        proxy.stop(nginx)
    assert status == 503 and headers["Retry-After"] == "1" and headers["X-Request-Id"] == "down-1"
    assert json.loads(text) == {"error": "the model server is not answering", "request_id": "down-1"}
