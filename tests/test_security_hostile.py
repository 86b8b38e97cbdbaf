"""The hostile-input tests of test_serve_api.py and test_serve_uploads.py, run again as they are against
an app with API keys on (the form too): a client with the key gets exactly the answers it got without
keys, and without the key every one of those requests is a 401, refused before its body is read.
"""

import pytest

from test_serve_api import (  # noqa: F401  (collected here again, with this module's app and client)
    samples,
    test_all_bad_is_4xx_naming_the_files,
    test_bad_request_body,
    test_bad_top_k,
    test_bad_upload,
    test_partial_failure_keeps_good_images,
    test_tfserving_bad_json_is_400,
    test_tfserving_bad_tensors_are_400,
    test_too_large_is_json_413,
    test_too_large_on_form_shows_words,
    test_unknown_model_version_or_route_is_json_404,
)
from test_serve_uploads import (  # noqa: F401
    test_a_part_without_even_an_empty_body_is_refused_clearly,
    test_bad_multipart_is_a_clear_4xx,
    test_bad_multipart_on_the_form_is_a_page,
    test_too_many_parts_is_413,
)

KEY = "hostile-input-test-key"


@pytest.fixture(scope="module")
def app(model_base):
    """conftest's app, with an API key required on the API and on the form."""
    from serve import create_app

    app = create_app(
        {"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": "cifar10", "MAX_UPLOAD_MB": 1, "API_KEYS": KEY}
    )
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
    from serve import uploads

    def never(*args, **kwargs):
        raise AssertionError("the body of a request without a key was parsed")

    monkeypatch.setattr(uploads, "parse", never)
    response = keyless.post(path, **kwargs)
    assert response.status_code == 401
    assert "WWW-Authenticate" in response.headers
