"""serve/gunicorn_conf.py's ``OneSendResponse``: the bytes gunicorn's own response sends, in one ``sendall``
where gunicorn makes two (head, then body), so a worker killed mid-answer loses all of it or none."""

import importlib
import sys
from types import SimpleNamespace

import pytest
from gunicorn import util
from gunicorn.http import wsgi


class Socket:
    def __init__(self):
        self.sends = []

    def sendall(self, data):
        self.sends.append(bytes(data))


@pytest.fixture
def one_send(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # the config's import makes no folder of its own
    monkeypatch.setattr(util, "http_date", lambda *_: "Sat, 05 Dec 2026 16:00:00 GMT")
    sys.modules.pop("serve.gunicorn_conf", None)
    try:
        yield importlib.import_module("serve.gunicorn_conf").OneSendResponse
    finally:
        sys.modules.pop("serve.gunicorn_conf", None)


def answer(response_class, method, status, headers, body):
    request = SimpleNamespace(version=(1, 1), method=method, should_close=lambda: False)
    sock = Socket()
    response = response_class(request, sock, SimpleNamespace())
    response.start_response(status, headers)
    for part in body:
        response.write(part)
    response.close()
    return sock.sends


@pytest.mark.parametrize("method, status, headers, body, sends", [
    ("POST", "200 OK", [("Content-Type", "application/json"), ("Content-Length", "13")], [b'{"answer": 1}'], 1),
    ("HEAD", "200 OK", [("Content-Length", "13")], [b'{"answer": 1}'], 1),
    ("GET", "204 No Content", [], [], 1),
    ("POST", "200 OK", [("Content-Length", "0")], [b""], 1),
    # No length: chunked, the head with the first chunk, then one send a chunk and the last, empty one.
    ("GET", "200 OK", [("Content-Type", "text/plain")], [b"first", b"second"], 3),
])
def test_the_same_bytes_as_gunicorn_with_the_head_in_the_first_send(one_send, method, status, headers, body, sends):
    ours = answer(one_send, method, status, headers, body)
    theirs = answer(wsgi.Response, method, status, headers, body)
    assert b"".join(ours) == b"".join(theirs)
    assert len(ours) == sends, ours
    assert ours[0].startswith(theirs[0])  # gunicorn's first send is the head alone


def test_gunicorn_sends_the_head_on_its_own(one_send):
    """What the class is for: if gunicorn ever sends head and body together, it can go."""
    theirs = answer(wsgi.Response, "POST", "200 OK", [("Content-Length", "2")], [b"{}"])
    assert len(theirs) == 2 and theirs[1] == b"{}"


def test_files_go_through_write(one_send):
    request = SimpleNamespace(version=(1, 1), method="GET", should_close=lambda: False)
    response = one_send(request, Socket(), SimpleNamespace(sendfile=True))
    assert response.sendfile(SimpleNamespace(filelike=None)) is False
