"""serve's fixtures. ``app`` and ``client`` run the whole front end (every protocol, the core, the metrics and
the guards) over a :class:`fake_backend.FakeBackend`, with no model and no training: serve's unit tests.

``real_app`` (tests/conftest.py) and ``real_client`` are the same app over the local backend and
``model_base``, the version exported from a real training run, for the tests of what a real runtime
answers; every test that needs the real model is marked ``end_to_end`` (tests/conftest.py refuses one that is not), so
``pytest tests/serve -m "not end_to_end"`` runs the unit tests alone.

``target`` and ``channel`` are the gRPC server over a module's own module-scoped ``app``, and a channel to it;
``access_lines``, what the access log writes, for the tests of request ids on either transport.
"""

import io
import json
import logging

import grpc
import pytest

import fake_backend
import grpc_servers


@pytest.fixture()
def backend():
    """A fresh :class:`fake_backend.FakeBackend` (version 1, the synthetic classes) for each test."""
    return fake_backend.FakeBackend()


#: Modules whose ``client`` tests run twice: as they are, and against the app with an API key required on the
#: API and the form, the client sending it: with the key a client gets exactly the answers it gets without keys.
KEYED_MODULES = ("test_serve_api", "test_multipart", "test_hostile")
KEY = "hostile-input-test-key"


def pytest_generate_tests(metafunc):
    if metafunc.module.__name__ in KEYED_MODULES and "client" in metafunc.fixturenames:
        metafunc.parametrize("api_key", [None, KEY], ids=["no-keys", "api-key"])


@pytest.fixture()
def api_key():
    """The API key the app requires and ``client`` sends (None: keys off); both, for the tests of :data:`KEYED_MODULES`."""
    return None


@pytest.fixture()
def app(backend, api_key):
    """The Flask app over ``backend``, with a 1 MiB upload limit."""
    return fake_backend.make_app(backend, api_key)


@pytest.fixture()
def client(app, api_key):
    """A test client of ``app``, sending ``api_key`` on every request when there is one."""
    client = app.test_client()
    if api_key:
        client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    return client


@pytest.fixture()
def real_client(real_app):
    return real_app.test_client()


@pytest.fixture(scope="module")
def target(app):
    """``host:port`` of the gRPC server (both gRPC APIs and health) over ``app``, one for the module's tests: a module
    that asks for it defines a module-scoped ``app``."""
    with grpc_servers.serving(app) as target:
        yield target


@pytest.fixture(scope="module")
def channel(target):
    """A gRPC channel to ``target``."""
    channel = grpc.insecure_channel(target)
    yield channel
    channel.close()


@pytest.fixture()
def access_lines():
    """The JSON lines the ``serve.access`` logger writes while the test runs."""
    from serve.telemetry import logs

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter("json"))
    handler.addFilter(logs.RequestIdFilter())
    logging.getLogger("serve.access").addHandler(handler)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logging.getLogger("serve.access").removeHandler(handler)
