"""Request ids and JSON logs (issue 45): one request followed through its answer, its error body and its log line."""

import base64
import io
import json
import logging
import re

import pytest

import synthetic
from fake_backend import make_app

KEY = "s3cret-key-material"


@pytest.fixture(scope="module")
def keyed():
    return make_app(API_KEYS=KEY)


def _png_b64():
    return base64.b64encode(synthetic.encode(synthetic.make_images(1)[0][0])).decode()


ROUTES = {
    "form": ("GET", "/", {}),
    "api": ("POST", "/api/v1/predict", {"json": {"instances": [{"b64": None}]}}),
    "tfserving-rest": ("POST", "/v1/models/cifar10:predict", {"json": {"signature_name": "predict_images", "instances": [{"b64": None}]}}),
    "v2": ("POST", "/v2/models/cifar10/infer", {"json": {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1],
                                                                     "parameters": {"content_type": "base64"}, "data": [None]}]}}),
    "health": ("GET", "/readyz", {}),
}


def _fill(kwargs, b64):
    text = json.dumps(kwargs).replace("null", json.dumps(b64))
    return json.loads(text)


@pytest.mark.parametrize("route", ROUTES)
def test_the_callers_id_comes_back_on_every_protocol(keyed, route):
    method, path, kwargs = ROUTES[route]
    answer = keyed.test_client().open(path, method=method, headers={"X-Request-Id": "trace-42.a:b_c", "X-API-Key": KEY},
                                      **_fill(kwargs, _png_b64()))
    assert answer.status_code == 200, answer.get_data(as_text=True)[:200]
    assert answer.headers["X-Request-Id"] == "trace-42.a:b_c"


@pytest.mark.parametrize("given", [None, "", "has space", "x" * 129, "semi;colon", "ünïcode"])
def test_a_missing_or_odd_id_is_replaced_by_a_new_one(keyed, given):
    headers = {"X-API-Key": KEY} if given is None else {"X-API-Key": KEY, "X-Request-Id": given}
    answer = keyed.test_client().get("/api/v1/model", headers=headers)
    assert re.fullmatch(r"[0-9a-f]{32}", answer.headers["X-Request-Id"])


@pytest.mark.parametrize("path, kwargs, status", [
    ("/api/v1/predict", {"json": {"instances": []}}, 400),
    ("/v1/models/nope:predict", {"json": {"instances": [1]}}, 404),
    ("/v2/models/cifar10/infer", {"data": "{", "content_type": "application/json"}, 400),
    ("/api/v1/no-such-route", {}, 404),
])
def test_every_error_body_names_the_request(keyed, path, kwargs, status):
    answer = keyed.test_client().post(path, headers={"X-API-Key": KEY, "X-Request-Id": "err-1"}, **kwargs)
    assert answer.status_code == status
    assert answer.get_json()["request_id"] == "err-1" == answer.headers["X-Request-Id"]


def test_a_refusal_before_the_view_names_the_request_too(keyed):
    answer = keyed.test_client().get("/api/v1/model", headers={"X-Request-Id": "no-key-1"})
    assert answer.status_code == 401 and answer.get_json()["request_id"] == "no-key-1"


def test_one_json_line_a_request_without_key_material(keyed, access_lines):
    client = keyed.test_client()
    good = client.post("/api/v1/predict", headers={"X-API-Key": KEY, "X-Request-Id": "good-1"},
                       json={"instances": [{"b64": _png_b64()}, {"b64": _png_b64()}]})
    bad = client.post("/api/v1/predict", headers={"Authorization": f"Bearer {KEY}x", "X-Request-Id": "bad-1"},
                      json={"instances": [{"b64": _png_b64()}]})
    assert good.status_code == 200 and bad.status_code == 401
    lines = {line["request_id"]: line for line in access_lines()}
    assert lines["good-1"]["status"] == 200 and lines["good-1"]["route"] == "/api/v1/predict"
    assert lines["good-1"]["model_version"] == 1 and lines["good-1"]["images"] == 2
    assert lines["good-1"]["duration_ms"] > 0 and lines["good-1"]["client"] == "127.0.0.1"
    assert lines["bad-1"]["status"] == 401 and lines["bad-1"]["images"] == 0
    assert {"time", "level", "logger", "message"} <= set(lines["good-1"])
    raw = json.dumps(list(lines.values()))
    assert KEY not in raw and _png_b64()[:40] not in raw


def test_text_is_a_setting():
    from serve.telemetry import logs
    from serve.settings import Settings, SettingsError

    assert Settings.from_env({}).log_format == "json"
    assert Settings.from_env({"SERVE_LOG_FORMAT": "text"}).log_format == "text"
    with pytest.raises(SettingsError, match="SERVE_LOG_FORMAT"):
        Settings.from_env({"SERVE_LOG_FORMAT": "xml"})
    record = logging.LogRecord("serve.access", logging.INFO, __file__, 1, "hello", (), None)
    logs.RequestIdFilter().filter(record)
    assert logs.formatter("text").format(record).endswith("serve.access [-] hello")


@pytest.mark.parametrize("kind", ["json", "text"])
def test_gunicorns_own_lines_in_the_same_format(monkeypatch, kind):
    from gunicorn.config import Config

    from serve.telemetry import logs

    logger = logs.gunicorn_logger(kind)(Config())
    stream = io.StringIO()
    for handler in logger.error_log.handlers:
        handler.stream = stream
    logger.info("Booting worker with pid: %s", 7)
    line = stream.getvalue().strip()
    if kind == "json":
        assert json.loads(line)["message"] == "Booting worker with pid: 7" and json.loads(line)["logger"] == "gunicorn.error"
    else:
        assert line.endswith("Booting worker with pid: 7") and not line.startswith("{")
