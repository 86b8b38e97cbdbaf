"""The in-process tests of the hostile-input modules, run again as they are against an app with API
keys on (the form too): a client with the key gets exactly the answers it got without keys, and
without the key every one of those requests is a 401, refused before its body is read.

Every test of those modules that takes the ``client`` fixture is collected here a second time
(named ``test_<module>__<test>``), with the fixtures it needs, and gets this module's ``app`` and
``client``; tests added to them later are picked up too. A module not in the tree yet is skipped.
"""

import importlib
import inspect

import pytest
from _pytest.fixtures import FixtureFunctionDefinition

import model_configs

HOSTILE_MODULES = ("test_serve_api", "test_serve_uploads", "test_hostile")
OWN_FIXTURES = ("app", "client")


def _borrow(module_name):
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        return 0
    borrowed = 0
    for name, obj in vars(module).items():
        if isinstance(obj, FixtureFunctionDefinition) and name not in OWN_FIXTURES:
            globals().setdefault(name, obj)
        elif name.startswith("test_") and inspect.isfunction(obj) and "client" in inspect.signature(obj).parameters:
            globals()[f"test_{module_name.removeprefix('test_')}__{name.removeprefix('test_')}"] = obj
            borrowed += 1
    return borrowed


BORROWED = {name: _borrow(name) for name in HOSTILE_MODULES}

KEY = "hostile-input-test-key"


@pytest.fixture(scope="module")
def app(model_base, tmp_path_factory):
    """test_hostile's app (version 1 also labelled ``stable``), with an API key required on the API and on the form."""
    from serve import create_app

    config = model_configs.labelled(tmp_path_factory.mktemp("config") / "models.config", "cifar10", model_base)
    app = create_app({"TESTING": True, "MODEL_CONFIG_FILE": str(config), "MODEL_CONFIG_POLL_S": 0, "MAX_UPLOAD_MB": 1,
                      "API_KEYS": KEY})
    app.extensions["serve.backend"].wait_loaded()
    yield app
    app.extensions["serve.backend"].close()


@pytest.fixture()
def client(app):
    """A test client that sends the key on every request."""
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {KEY}"
    return client


@pytest.fixture()
def keyless(app):
    return app.test_client()


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


def test_the_suites_were_borrowed():
    """Guards the collection above: renaming or moving those modules must not empty this one quietly."""
    assert BORROWED["test_serve_api"] >= 20 and BORROWED["test_serve_uploads"] >= 4, BORROWED
