"""The client under refusal: it waits out 429 and 503 as Retry-After asks (bounded), sends the same
request again, and never turns a refused batch into one request per image."""

import http.server
import json
import re
import threading

import pytest

import synthetic
from client import cli


class _Refusing(http.server.ThreadingHTTPServer):
    """Answers ``answers`` in turn (then the last one for ever), and counts each request by path."""

    def __init__(self, answers):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers = list(answers)
        self.requests = []


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802  (the name http.server calls)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server = self.server
        server.requests.append(self.path)
        status, headers, body = server.answers[min(len(server.requests), len(server.answers)) - 1]
        payload = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(payload)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing():
    servers = []

    def start(answers):
        server = _Refusing(answers)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def waits(monkeypatch):
    """The seconds urllib3 would have slept between tries; nothing sleeps."""
    import urllib3.util.retry

    slept = []
    monkeypatch.setattr(urllib3.util.retry.time, "sleep", slept.append)
    return slept


def _files(tmp_path, count):
    images, _ = synthetic.make_images(count, seed=4)
    paths = []
    for i, image in enumerate(images[:count]):
        path = tmp_path / f"{i}.png"
        path.write_bytes(synthetic.encode(image))
        paths.append(str(path))
    return paths


TOO_MANY = (429, {"Retry-After": "7"}, {"error": "too many requests: the limit is 10 per 1 second; retry after 7 s"})


def _prediction(count):
    top = [{"label": "cat", "class_id": 3, "probability": 0.9}]
    return {"model": {"name": "cifar10", "version": 1}, "predictions": [
        {"filename": f"{i}.png", "label": "cat", "class_id": 3, "probability": 0.9, "top_k": top} for i in range(count)]}


def test_a_429_is_waited_out_as_retry_after_asks_then_the_batch_goes_through(refusing, waits, tmp_path, capsys):
    files = _files(tmp_path, 16)
    server, url = refusing([TOO_MANY, TOO_MANY, (200, {}, _prediction(16))])
    assert cli.main(["predict", *files, "--url", url, "--batch-size", "16"]) == 0
    assert server.requests == ["/api/v1/predict"] * 3  # the same batch, whole, three times
    assert waits == [7, 7]
    assert len([line for line in capsys.readouterr().out.splitlines() if re.search(r"\.png\s+cat\s", line)]) == 16


def test_a_refused_batch_is_never_sent_image_by_image(refusing, waits, tmp_path, capsys):
    files = _files(tmp_path, 16)
    server, url = refusing([TOO_MANY])
    code = cli.main(["predict", *files, "--url", url, "--batch-size", "16", "--retries", "2"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_FAILED
    assert len(server.requests) == 3  # one batch and two retries: not 16 more, and no second batch
    assert err.count("\n") == 1 and "HTTP 429" in err and "after 2 retries" in err
    assert waits == [7, 7]


def test_a_long_retry_after_is_capped(refusing, waits, tmp_path):
    server, url = refusing([(429, {"Retry-After": "3600"}, {"error": "slow down"}), (200, {}, _prediction(1))])
    assert cli.main(["predict", *_files(tmp_path, 1), "--url", url, "--max-wait", "5"]) == 0
    assert waits == [5]


def test_a_503_without_retry_after_backs_off_then_exits_3(refusing, waits, tmp_path, capsys):
    server, url = refusing([(503, {}, {"error": "the model is still loading"})])
    assert cli.main(["predict", *_files(tmp_path, 2), "--url", url]) == cli.EXIT_UNREACHABLE
    assert len(server.requests) == 4  # the first try and three retries
    assert waits and all(0 < w <= 30 for w in waits)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "still loading" in err


def test_a_400_batch_is_still_asked_again_one_by_one_to_name_the_bad_image(refusing, waits, tmp_path, capsys):
    good = (200, {}, _prediction(1))
    server, url = refusing([(400, {}, {"error": "one of them is not an image"}), good, good, good])
    assert cli.main(["predict", *_files(tmp_path, 3), "--url", url, "--batch-size", "3", "--via", "api"]) == 0
    assert len(server.requests) == 4 and waits == []
