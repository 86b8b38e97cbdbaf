"""The client against a hostile or broken server (issue 42, item 10): a total deadline per request however
slowly the answer trickles, a cap on the answer's size, one line (never a traceback) for a malformed
answer, control characters escaped before anything from the server reaches the terminal, and no redirect
followed, least of all to another host.

The servers here are small raw-socket servers on 127.0.0.1, port 0, one thread per connection. A
trickling server sends a byte every 0.2 s for as long as the test lets it: nothing here waits for a
timing window; the bounds asserted are generous (a 1 s deadline, given up on within 20 s).
"""

import json
import socket
import socketserver
import threading
import time

import pytest

import contract
import synthetic
from client import cli, output
from client.transports import common, http

HTTP_VIAS = ("api", "tfserving-rest", "v2")
MODEL = contract.DEFAULT_MODEL_NAME
#: Where each HTTP transport sends a prediction.
PREDICT_PATHS = {"api": "/api/v1/predict", "tfserving-rest": f"/v1/models/{MODEL}:predict", "v2": f"/v2/models/{MODEL}/infer"}
V2_METADATA = {"name": MODEL, "versions": ["1"], "platform": "hostile", "inputs": [],
               "outputs": [{"name": contract.OUTPUT_PROBABILITIES}, {"name": contract.OUTPUT_OOD_SCORE},
                           {"name": contract.OUTPUT_IN_DISTRIBUTION}]}
GENEROUS_S = 20


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host, behaviour):
        super().__init__((host, 0), _Handler)
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.requests = []  # (method, path, headers) of every request read
        self.sockets = []

    @property
    def url(self):
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(socketserver.StreamRequestHandler):
    """Reads a request and lets the test's behaviour answer it; then closes the connection, unless the
    behaviour returns True (it answered without ``Connection: close``) and the client sends another."""

    def handle(self):
        self.server.sockets.append(self.connection)
        while request_line := self.rfile.readline(65537):
            headers = {}
            while (line := self.rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            self.rfile.read(int(headers.get("content-length", 0)))
            method, path, _ = request_line.decode("latin-1").split(" ", 2)
            self.server.requests.append((method, path, headers))
            try:
                if not self.server.behaviour(self, method, path):
                    return
            except OSError:  # the client gave up and closed its end
                return

    def send(self, data):
        self.wfile.write(data)


@pytest.fixture
def serve():
    """``serve(behaviour, host="127.0.0.1")`` starts a server whose ``behaviour(handler, method, path)``
    answers every request; all are stopped (trickles ended, connections shut) after the test."""
    servers = []

    def start(behaviour, host="127.0.0.1"):
        server = _Server(host, behaviour)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop.set()
        for sock in server.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        server.shutdown()
        server.server_close()


def head(status=200, reason="OK", headers=(), keep_alive=False):
    lines = [f"HTTP/1.1 {status} {reason}", *([] if keep_alive else ["Connection: close"]), *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def answer(handler, status, body, headers=(), reason="OK", keep_alive=False):
    """A whole answer: ``body`` (bytes, or JSON as text) with its Content-Length; returns ``keep_alive``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send(head(status, reason, ["Content-Type: application/json", f"Content-Length: {len(data)}", *headers],
                      keep_alive) + data)
    return keep_alive


def routes(**answers_by_via):
    """A behaviour answering each transport's predict path with the body given for it, and v2's metadata."""

    def behaviour(handler, method, path):
        if path == f"/v2/models/{MODEL}" and method == "GET":
            return answer(handler, 200, V2_METADATA)
        for via, body in answers_by_via.items():
            if path == PREDICT_PATHS[via.replace("_", "-")]:
                return answer(handler, 200, body)
        answer(handler, 404, {"error": f"no route {path}"})

    return behaviour


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "cat.png"
    path.write_bytes(synthetic.encode(synthetic.make_images(1, seed=7)[0][0]))
    return str(path)


def run(capsys, args):
    """(exit code, stdout, stderr, seconds) of ``client ARGS`` in this process."""
    started = time.monotonic()
    code = cli.main(args)
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    return code, out, err, elapsed


def one_line(err):
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("client: "), err
    return err


# -- a total deadline: connect, send, and the whole answer -------------------------------------------


def trickle_status_line(handler, method, path):
    handler.send(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    while not handler.server.stop.wait(0.2):
        handler.send(b"x")


def trickle_body(handler, method, path):
    handler.send(head(headers=["Content-Type: application/json", "Content-Length: 1000000"]) + b"[")
    while not handler.server.stop.wait(0.2):
        handler.send(b" ")


def trickle_chunks(handler, method, path):
    handler.send(head(headers=["Content-Type: application/json", "Transfer-Encoding: chunked"]) + b"1\r\n[\r\n")
    while not handler.server.stop.wait(0.2):
        handler.send(b"1\r\n \r\n")


@pytest.mark.parametrize("trickle", [trickle_status_line, trickle_body, trickle_chunks])
@pytest.mark.parametrize("via", HTTP_VIAS)
def test_a_trickling_answer_is_given_up_on_at_the_deadline(via, trickle, serve, image, capsys):
    server = serve(trickle)
    code, out, err, elapsed = run(capsys, ["predict", image, "--via", via, "--url", server.url, "--timeout", "1"])
    assert code == cli.EXIT_UNREACHABLE
    assert elapsed < GENEROUS_S
    assert "within 1 s (--timeout)" in one_line(err) and out == ""
    assert len(server.requests) == 1  # given up on, not sent again


@pytest.mark.parametrize("command", ["health", "info"])
def test_health_and_info_have_the_deadline_too(command, serve, capsys):
    server = serve(trickle_body)
    code, _, err, elapsed = run(capsys, [command, "--url", server.url, "--timeout", "1"])
    assert code == cli.EXIT_UNREACHABLE and elapsed < GENEROUS_S and "within 1 s" in one_line(err)


def test_each_retry_gets_its_own_deadline_and_the_waits_count_in_none(serve, image, capsys, monkeypatch):
    """A 429 asking for 2 s, with a 1 s deadline, is waited out, and the next try is answered."""
    slept = []
    monkeypatch.setattr(http.time, "sleep", slept.append)

    def behaviour(handler, method, path):
        if len(handler.server.requests) == 1:
            return answer(handler, 429, {"error": "slow down"}, ["Retry-After: 2"])
        answer(handler, 200, {"predictions": [{"label": "cat", "class_id": 3, "probability": 0.9, "top_k": []}]})

    server = serve(behaviour)
    code, out, err, _ = run(capsys, ["predict", image, "--url", server.url, "--timeout", "1", "--json"])
    assert code == 0, err
    assert slept == [2] and len(server.requests) == 2
    assert json.loads(out)["label"] == "cat"


def _files(tmp_path, count):
    paths = []
    for i, img in enumerate(synthetic.make_images(count, seed=2)[0][:count]):
        paths.append(str(tmp_path / f"{i}.png"))
        (tmp_path / f"{i}.png").write_bytes(synthetic.encode(img))
    return paths


def test_a_connection_kept_alive_is_reused_and_still_under_the_deadline(serve, tmp_path, capsys):
    """Two batches answered on one kept-alive connection; the third, on the same connection, trickles,
    and is given up on: a connection taken from the pool is watched like a new one."""
    def behaviour(handler, method, path):
        if len(handler.server.requests) <= 2:
            return answer(handler, 200, {"predictions": [{"label": "dog", "class_id": 5, "probability": 0.5}]},
                          keep_alive=True)
        trickle_body(handler, method, path)

    server = serve(behaviour)
    code, out, err, elapsed = run(capsys, ["predict", *_files(tmp_path, 3), "--url", server.url, "--batch-size", "1",
                                           "--json", "--timeout", "1"])
    assert code == cli.EXIT_UNREACHABLE and elapsed < GENEROUS_S and "within 1 s" in one_line(err)
    assert [json.loads(line)["label"] for line in out.splitlines()] == ["dog", "dog"]
    assert len(server.requests) == 3 and len(server.sockets) == 1  # all three on one connection


# -- a cap on the answer's size ---------------------------------------------------------------------


def endless(framing):
    block = b" " * 65536

    def behaviour(handler, method, path):
        headers = {"declared": ["Content-Length: 1000000000000"], "close-delimited": [],
                   "chunked": ["Transfer-Encoding: chunked"]}[framing]
        handler.send(head(headers=["Content-Type: application/json", *headers]) + (b"1\r\n[\r\n" if framing == "chunked" else b"["))
        while not handler.server.stop.is_set():
            handler.send(b"10000\r\n" + block + b"\r\n" if framing == "chunked" else block)

    return behaviour


@pytest.mark.parametrize("framing", ["declared", "close-delimited", "chunked"])
@pytest.mark.parametrize("via", HTTP_VIAS)
def test_an_endless_answer_is_cut_off_at_the_cap(via, framing, serve, image, capsys):
    server = serve(endless(framing))
    code, out, err, elapsed = run(capsys, ["predict", image, "--via", via, "--url", server.url])
    assert code == cli.EXIT_FAILED and elapsed < GENEROUS_S
    assert "larger than 16 MiB" in one_line(err) and "MAX_ANSWER_BYTES" in err


def test_a_compressed_answer_is_refused(serve, image, capsys):
    def behaviour(handler, method, path):
        answer(handler, 200, b"\x1f\x8b\x08\x00", ["Content-Encoding: gzip"])

    server = serve(behaviour)
    code, _, err, _ = run(capsys, ["predict", image, "--url", server.url])
    assert code == cli.EXIT_FAILED and "'gzip' coding" in one_line(err)
    assert server.requests[0][2]["accept-encoding"] == "identity"


# -- a malformed answer: one line, never a traceback ------------------------------------------------


def _api(**changes):
    prediction = {"filename": "cat.png", "label": "cat", "class_id": 3, "probability": 0.9,
                  "top_k": [{"label": "cat", "class_id": 3, "probability": 0.9}], "ood_score": 1.5, "in_distribution": True}
    return {"predictions": [{**prediction, **changes}]}


def _v2(shape=(1, 1), data=("0.9:3:cat",), extra=()):
    return {"model_name": MODEL, "outputs": [
        {"name": contract.OUTPUT_PROBABILITIES, "datatype": "BYTES", "shape": list(shape), "data": list(data)}, *extra]}


def _tfs(**changes):
    row = {contract.OUTPUT_PROBABILITIES: [0.1] * 9 + [0.1], contract.OUTPUT_CLASS_IDS: 3,
           contract.OUTPUT_CLASS_NAMES: "cat", **changes}
    return {"predictions": [row]}


MALFORMED = {
    "api": {
        "null probability": _api(probability=None),
        "string probability": _api(probability="0.9"),
        "NaN probability": b'{"predictions": [{"label": "cat", "class_id": 3, "probability": NaN}]}',
        "a number too large": b'{"predictions": [{"label": "cat", "class_id": 3, "probability": 1e999}]}',
        "null in top_k": _api(top_k=[None]),
        "null probability in top_k": _api(top_k=[{"label": "cat", "class_id": 3, "probability": None}]),
        "top_k an object": _api(top_k={"cat": 0.9}),
        "a number for a label": _api(label=5),
        "a string for a verdict": _api(in_distribution="yes"),
        "a string for a score": _api(ood_score="high"),
        "a prediction that is a list": {"predictions": [[1, 2]]},
        "no predictions": {"predictions": []},
        "predictions a string": {"predictions": "cat"},
        "a list": [1, 2, 3],
        "not JSON": b"<html>hello</html>",
        "not UTF-8": b'{"predictions": ["\xff\xfe"]}',
        "nested too deep": b"[" * 100_000 + b"]" * 100_000,
    },
    "v2": {
        "a classification of shape [1, 0]": _v2(shape=(1, 0), data=()),
        "a null cell": _v2(data=(None,)),
        "a cell with no class": _v2(data=("0.9",)),
        "a NaN cell": _v2(data=("nan:3:cat",)),
        "a cell with a word for a class": _v2(data=("0.9:cat",)),
        "a shape that is a string": _v2(shape="1x1"),
        "too few cells": _v2(shape=(1, 2)),
        "too many rows": _v2(shape=(2, 1), data=("0.9:3", "0.8:2")),
        "outputs an object": {"outputs": {"probabilities": []}},
        "no probabilities": {"outputs": []},
        "a score that is a word": _v2(extra=({"name": contract.OUTPUT_OOD_SCORE, "data": ["high"]},)),
        "too few scores": _v2(extra=({"name": contract.OUTPUT_OOD_SCORE, "data": []},)),
        "not JSON": b"\x00\x01",
    },
    "tfserving-rest": {
        "a class id outside the probabilities": _tfs(**{contract.OUTPUT_CLASS_IDS: 10}),
        "a negative class id": _tfs(**{contract.OUTPUT_CLASS_IDS: -1}),
        "a null probability": _tfs(**{contract.OUTPUT_PROBABILITIES: [None] * 10}),
        "no probabilities": _tfs(**{contract.OUTPUT_PROBABILITIES: None}),
        "a class id that is a string": _tfs(**{contract.OUTPUT_CLASS_IDS: "3"}),
        "a class name that is a number": _tfs(**{contract.OUTPUT_CLASS_NAMES: 3}),
        "a verdict that is a string": _tfs(**{contract.OUTPUT_IN_DISTRIBUTION: "false"}),
        "no predictions": {"predictions": []},
        "a row that is a list": {"predictions": [[0.1, 0.9]]},
        "a list": [],
        "predictions null": {"predictions": None},
    },
}


@pytest.mark.parametrize("output", ["table", "json"])
@pytest.mark.parametrize("via, case", [(via, case) for via, cases in MALFORMED.items() for case in cases])
def test_a_malformed_answer_is_one_line_and_exit_1(via, case, output, serve, image, capsys):
    server = serve(routes(**{via.replace("-", "_"): MALFORMED[via][case]}))
    args = ["predict", image, "--via", via, "--url", server.url, *(["--json"] if output == "json" else [])]
    code, out, err, _ = run(capsys, args)
    assert code == cli.EXIT_FAILED
    assert "malformed answer from http://127.0.0.1:" in one_line(err)
    assert out == ""


@pytest.mark.parametrize("body", [
    [1, 2], "a string", b"not JSON", {"name": 5}, {"name": "cifar10", "class_names": "cat"},
    {"name": "cifar10", "class_names": [1, None]}, {"name": "cifar10", "signatures": ["serving_default"]},
])
def test_a_malformed_model_description_is_one_line(body, serve, capsys):
    server = serve(lambda handler, method, path: answer(handler, 200, body))
    code, out, err, _ = run(capsys, ["info", "--url", server.url])
    assert code == cli.EXIT_FAILED and "malformed answer" in one_line(err) and out == ""


@pytest.mark.parametrize("via, status", [
    ("tfserving-rest", [1]), ("tfserving-rest", {"model_version_status": "AVAILABLE"}),
    ("tfserving-rest", {"model_version_status": [{"state": "AVAILABLE", "version": "one"}]}),
    ("v2", {"versions": "1"}), ("v2", {"versions": ["1"], "inputs": [7]}), ("v2", {"versions": ["1"], "outputs": {"a": 1}}),
])
def test_malformed_health_and_metadata_are_one_line(via, status, serve, capsys):
    def behaviour(handler, method, path):
        answer(handler, 200, status if path != f"/v2/models/{MODEL}/ready" else {})

    server = serve(behaviour)
    for command in ("health", "info"):
        code, _, err, _ = run(capsys, [command, "--via", via, "--url", server.url])
        assert code != 0 and "malformed answer" in one_line(err), command


# -- control characters from the server are escaped --------------------------------------------------


EVIL = "\x1b[31mcat\x1b]0;pwned\x07\x9b2J\u202e\r\nfake: line\ud800"


def test_labels_from_the_server_are_printed_escaped(serve, image, capsys):
    prediction = {"filename": "cat.png", "label": EVIL, "class_id": 3, "probability": 0.9,
                  "top_k": [{"label": EVIL, "class_id": 3, "probability": 0.9}], "ood_score": None, "in_distribution": None}
    server = serve(routes(api={"predictions": [prediction]}))
    code, out, err, _ = run(capsys, ["predict", image, "--url", server.url])
    assert code == 0, err
    header, row = out.splitlines()  # one row: the label's \r\n does not start another
    for raw in ("\x1b", "\x07", "\x9b", "\u202e", "\r", "\ud800"):
        assert raw not in out
    assert "\\x1b[31mcat\\x1b]0;pwned\\x07\\x9b2J\\u202e\\x0d\\x0afake: line\\ud800" in row


def test_json_output_stays_json_and_keeps_the_label_exactly(serve, image, capsys):
    prediction = {"label": EVIL, "class_id": 3, "probability": 0.9, "top_k": []}
    server = serve(routes(api={"predictions": [prediction]}))
    code, out, err, _ = run(capsys, ["predict", image, "--url", server.url, "--json"])
    assert code == 0, err
    assert out.isascii() and "\x1b" not in out
    assert json.loads(out)["label"] == EVIL


@pytest.mark.parametrize("how", ["refusal", "per-image error", "reason phrase"])
def test_errors_from_the_server_are_printed_escaped_on_one_line(how, serve, image, capsys):
    def behaviour(handler, method, path):
        if how == "refusal":
            answer(handler, 413, {"error": EVIL})
        elif how == "per-image error":
            answer(handler, 400, {"predictions": [{"filename": "cat.png", "error": EVIL, "status": 400}]})
        else:
            answer(handler, 500, b"", reason="\x1b[2J\x1b]0;pwned\x07")

    server = serve(behaviour)
    code, out, err, _ = run(capsys, ["predict", image, "--url", server.url, "--json"])
    assert code == cli.EXIT_FAILED
    for raw in ("\x1b", "\x07", "\x9b", "\u202e", "\r", "\ud800"):
        assert raw not in err
    assert "\\x1b" in err
    lines = err.splitlines()
    assert len(lines) == (2 if how == "per-image error" else 1)  # the image's error, then the count
    for line in out.splitlines():
        json.loads(line)


def test_a_long_error_is_cut(serve, image, capsys):
    server = serve(lambda handler, method, path: answer(handler, 500, {"error": "x" * 100_000}))
    code, _, err, _ = run(capsys, ["predict", image, "--url", server.url])
    assert code == cli.EXIT_FAILED and len(one_line(err)) < 1000


def test_model_description_is_printed_escaped(serve, capsys):
    body = {"name": "\x1b[2Jcifar10", "version": "\x1b[1m1", "architecture": {"x": "\x1b"}, "class_names": ["\x1b[31mcat"],
            "signatures": {"\x1b]0;t\x07": {"inputs": ["\x1b"], "outputs": {"\x9b": 1}}, "other": "\x1b"}, "backend": "\u202e"}
    server = serve(lambda handler, method, path: answer(handler, 200, body))
    code, out, err, _ = run(capsys, ["info", "--url", server.url])
    assert code == 0, err
    for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert raw not in out
    assert "\\x1b[2Jcifar10" in out


def test_printable_escapes_c0_c1_format_characters_separators_and_surrogates():
    assert output.printable("plain text, accents: é ß 猫") == "plain text, accents: é ß 猫"
    assert output.printable("\x00\t\x1b\x7f\x85\x9b") == "\\x00\\x09\\x1b\\x7f\\x85\\x9b"
    assert output.printable("\u200b\u202e\u2028\u2029\ufeff\ud800") == "\\u200b\\u202e\\u2028\\u2029\\ufeff\\ud800"
    assert output.printable("\U000e0001") == "\\U000e0001"  # a tag character (format)


# -- redirects are not followed ----------------------------------------------------------------------


def _redirector(location, status=307):
    def behaviour(handler, method, path):
        handler.send(head(status, "Temporary Redirect", [f"Location: {location}", "Content-Length: 0"]))

    return behaviour


def _other_host(serve, host):
    try:
        return serve(lambda handler, method, path: answer(handler, 200, _api()), host=host)
    except OSError as error:  # 127.0.0.2 is not a loopback address on every system
        pytest.skip(f"cannot listen on {host}: {error}")


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("target_host", ["127.0.0.2", "localhost"])
@pytest.mark.parametrize("via", HTTP_VIAS)
def test_a_redirect_to_another_host_is_refused_and_nothing_is_sent_there(via, target_host, status, serve, image, capsys):
    target = _other_host(serve, "127.0.0.1" if target_host == "localhost" else target_host)
    port = target.server_address[1]
    server = serve(_redirector(f"http://{target_host}:{port}/steal", status))
    code, out, err, _ = run(capsys, ["predict", image, "--via", via, "--url", server.url, "--api-key", "secret"])
    assert code == cli.EXIT_FAILED
    line = one_line(err)
    assert f"redirects to http://{target_host}:{port}/steal, another host" in line and "secret" not in line
    assert target.requests == []
    assert len(server.requests) == 1


def test_a_redirect_to_the_same_host_is_refused_too(serve, image, capsys):
    server = serve(_redirector("/elsewhere", 308))
    code, _, err, _ = run(capsys, ["predict", image, "--url", server.url])
    assert code == cli.EXIT_FAILED
    assert f"redirects to {server.url}/elsewhere (HTTP 308); the client follows no redirects" in one_line(err)
    assert len(server.requests) == 1


def test_a_redirect_is_refused_without_reading_its_body(serve, image, capsys):
    def behaviour(handler, method, path):
        handler.send(head(307, "Temporary Redirect", ["Location: http://127.0.0.2/"]))
        while not handler.server.stop.is_set():  # close-delimited, endless
            handler.send(b" " * 65536)

    server = serve(behaviour)
    code, _, err, elapsed = run(capsys, ["predict", image, "--url", server.url])
    assert code == cli.EXIT_FAILED and "another host" in one_line(err) and elapsed < GENEROUS_S


def test_a_redirect_with_an_unparsable_location_is_refused_as_another_host(serve, image, capsys):
    server = serve(_redirector("http://[::1:80/x"))
    code, _, err, _ = run(capsys, ["predict", image, "--url", server.url])
    assert code == cli.EXIT_FAILED and "another host" in one_line(err)


# -- gRPC: its own deadline and size cap, and the same one line for a malformed answer -----------------


@pytest.fixture
def grpc_server():
    """``grpc_server(predict)`` serves TF Serving's PredictionService with ``predict(request, context)``."""
    from concurrent import futures

    import grpc

    from tfs_protos.tensorflow_serving.apis import prediction_service_pb2_grpc

    started, release = [], threading.Event()

    def start(predict):
        class Service(prediction_service_pb2_grpc.PredictionServiceServicer):
            def Predict(self, request, context):  # noqa: N802  (the name gRPC calls)
                return predict(request, context, release)

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Service(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append(server)
        return f"127.0.0.1:{port}"

    yield start
    release.set()
    for server in started:
        server.stop(0)


def _predict_response(**outputs):
    from tfs_protos import tensors
    from tfs_protos.tensorflow_serving.apis import predict_pb2

    response = predict_pb2.PredictResponse()
    for name, value in outputs.items():
        response.outputs[name].CopyFrom(value if not hasattr(value, "shape") else tensors.to_proto(value))
    return response


def test_grpc_has_a_total_deadline(grpc_server, image, capsys):
    def never(request, context, release):
        release.wait()
        return _predict_response()

    target = grpc_server(never)
    code, _, err, elapsed = run(capsys, ["predict", image, "--via", "tfserving-grpc", "--url", target, "--timeout", "1"])
    assert code == cli.EXIT_UNREACHABLE and elapsed < GENEROUS_S
    assert "within 1 s (--timeout)" in one_line(err)


def test_grpc_answers_over_the_cap_are_refused(grpc_server, image, capsys):
    import numpy as np

    def huge(request, context, release):
        return _predict_response(**{contract.OUTPUT_CLASS_NAMES: np.array([b"x" * (common.MAX_ANSWER_BYTES + 1)], object)})

    target = grpc_server(huge)
    code, _, err, _ = run(capsys, ["predict", image, "--via", "tfserving-grpc", "--url", target])
    assert code == cli.EXIT_FAILED and f"at most {common.MAX_ANSWER_BYTES} bytes" in one_line(err)


def _grpc_malformed():
    import numpy as np

    from tfs_protos import tensors

    good = {contract.OUTPUT_PROBABILITIES: np.full((1, 10), 0.1, np.float32),
            contract.OUTPUT_CLASS_IDS: np.array([3], np.int64), contract.OUTPUT_CLASS_NAMES: np.array([b"cat"], object)}
    vast = tensors.to_proto(np.array([0.5], np.float32))
    vast.tensor_shape.dim[0].size = 2**40  # one value, and a shape that would be filled out to 4 TiB
    return {
        "no outputs": {},
        "no class ids": {k: v for k, v in good.items() if k != contract.OUTPUT_CLASS_IDS},
        "a class id outside the probabilities": {**good, contract.OUTPUT_CLASS_IDS: np.array([12], np.int64)},
        "two class ids for one image": {**good, contract.OUTPUT_CLASS_IDS: np.array([3, 4], np.int64)},
        "no probabilities for the image": {**good, contract.OUTPUT_PROBABILITIES: np.zeros((1, 0), np.float32)},
        "a vast declared shape": {**good, contract.OUTPUT_PROBABILITIES: vast},
        "NaN probabilities": {**good, contract.OUTPUT_PROBABILITIES: np.full((1, 10), np.nan, np.float32)},
        "class ids as floats": {**good, contract.OUTPUT_CLASS_IDS: np.array([3.5], np.float32)},
        "names that are not UTF-8": {**good, contract.OUTPUT_CLASS_NAMES: np.array([b"\xff"], object)},
    }


@pytest.mark.parametrize("case", list(_grpc_malformed()))
def test_a_malformed_grpc_answer_is_one_line(case, grpc_server, image, capsys):
    outputs = _grpc_malformed()[case]
    target = grpc_server(lambda request, context, release: _predict_response(**outputs))
    code, out, err, _ = run(capsys, ["predict", image, "--via", "tfserving-grpc", "--url", target])
    assert code == cli.EXIT_FAILED and f"malformed answer from {target}" in one_line(err) and out == ""


# -- round 3 (issue 55): a hostile gRPC server's metadata is one line too -------------------------------------------


@pytest.fixture
def metadata_server():
    """``metadata_server(servicer, add)`` serves ``servicer`` (added to a new server by ``add``) on a free port."""
    from concurrent import futures

    import grpc

    started = []

    def start(servicer, add):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        add(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in started:
        server.stop(0)


def test_a_signature_def_that_does_not_parse_is_one_line(metadata_server, capsys):
    from tfs_protos.tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    class Hostile(prediction_service_pb2_grpc.PredictionServiceServicer):
        def GetModelMetadata(self, request, context):  # noqa: N802  (the name gRPC calls)
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = MODEL
            response.metadata["signature_def"].type_url = "type.googleapis.com/tensorflow.serving.SignatureDefMap"
            response.metadata["signature_def"].value = b"\xff\xff\xff not a message"
            return response

    target = metadata_server(Hostile(), prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server)
    code, out, err, _ = run(capsys, ["info", "--via", "tfserving-grpc", "--url", target])
    assert code == cli.EXIT_FAILED and "malformed answer" in one_line(err) and "Traceback" not in err and out == ""


@pytest.mark.parametrize("versions", [["\u00b2"], ["1", "\u0663"]], ids=["superscript-two", "arabic-indic-three"])
def test_versions_that_are_digits_but_not_numbers_are_printed_not_parsed(versions, metadata_server, capsys):
    from tfs_protos.inference import grpc_predict_v2_pb2 as pb, grpc_predict_v2_pb2_grpc

    class Hostile(grpc_predict_v2_pb2_grpc.GRPCInferenceServiceServicer):
        def ModelMetadata(self, request, context):  # noqa: N802
            return pb.ModelMetadataResponse(name=MODEL, versions=versions, platform="hostile")

    target = metadata_server(Hostile(), grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server)
    code, out, err, _ = run(capsys, ["info", "--via", "v2-grpc", "--url", target])
    assert code == 0 and "Traceback" not in err and "version:" in out
