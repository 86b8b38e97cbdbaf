"""Hostile input without the API key, against an app with keys on (the form too): every request is a 401,
refused before its body is read.

The in-process hostile tests themselves (test_serve_api, test_multipart, test_hostile) run a second
time with keys on and the key sent (tests/serve/conftest.py's ``api_key``), and must get the answers they
get without keys.
"""

import pathlib

import pytest

from fake_backend import make_app

SERVE_TESTS = pathlib.Path(__file__).parents[1]
KEY = "hostile-input-test-key"


@pytest.fixture()
def keyless():
    """A client without the key, of an app that requires one on the API and on the form."""
    return make_app(API_KEYS=KEY).test_client()


@pytest.mark.parametrize(
    "path, kwargs",
    [
        ("/api/v1/predict", {"data": b"not multipart at all", "content_type": "multipart/form-data; boundary=b"}),
        ("/api/v1/predict", {"data": b'{"instances": [', "content_type": "application/json"}),
        ("/api/v1/predict", {"data": b"\0" * (2 * 1024 * 1024), "content_type": "application/octet-stream"}),
        ("/v1/models/cifar10:predict", {"data": b"{nope", "content_type": "application/json"}),
        ("/", {"data": b"garbage", "content_type": "multipart/form-data; boundary=b"}),
    ],
    ids=["bad-multipart", "bad-json", "too-large", "tfserving-bad-json", "form-garbage"],
)
def test_without_the_key_hostile_input_is_401_unread(keyless, monkeypatch, path, kwargs):
    from serve.protocols import multipart as uploads

    def never(*args, **kwargs):
        raise AssertionError("the body of a request without a key was parsed")

    monkeypatch.setattr(uploads, "parse", never)
    response = keyless.post(path, **kwargs)
    assert response.status_code == 401
    assert "WWW-Authenticate" in response.headers


def test_the_keyed_modules_are_there(request):
    """Guards the second run: renaming those modules must not end it quietly (a module is keyed by its name, in any
    folder of tests/serve)."""
    modules = request.config.pluginmanager.getplugin(str(SERVE_TESTS / "conftest.py"))
    for name in modules.KEYED_MODULES:
        assert len(list(SERVE_TESTS.rglob(f"{name}.py"))) == 1, name
