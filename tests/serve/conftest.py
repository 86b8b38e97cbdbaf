"""serve's fixtures. ``app`` and ``client`` run the whole front end (every protocol, the core, the metrics and
the guards) over a :class:`fake_backend.FakeBackend`, with no model and no training: serve's unit tests.

``real_app`` and ``real_client`` are the same app over the local backend and ``model_base``, the version
exported from a real training run, for the tests of what a real runtime answers; every test that
needs the real model is marked ``end_to_end`` (tests/conftest.py refuses one that is not), so
``pytest tests/serve -m "not end_to_end"`` runs the unit tests alone.
"""

import pytest

import fake_backend

@pytest.fixture()
def backend():
    """A fresh :class:`fake_backend.FakeBackend` (version 1, the synthetic classes) for each test."""
    return fake_backend.FakeBackend()


@pytest.fixture()
def app(backend):
    """The Flask app over ``backend``, with a 1 MiB upload limit."""
    return fake_backend.make_app(backend)


@pytest.fixture()
def client(app):
    return app.test_client()


@pytest.fixture(scope="module")
def real_app(model_base):
    """The Flask app over the local backend and ``model_base``, with a 1 MiB upload limit."""
    from serve import create_app

    app = create_app({**fake_backend.APP_SETTINGS, "MODEL_DIR": str(model_base)})
    app.extensions["serve.backend"].wait_loaded()
    yield app
    app.extensions["serve.backend"].close()


@pytest.fixture()
def real_client(real_app):
    return real_app.test_client()
