"""How uploads are read (serve/protocols/multipart.py): many images in one body, and the parser's refusals."""

import io

import pytest

import synthetic
from synthetic import photo_like


def test_many_images_in_one_multipart_body(client):
    files = [(f"{i}.jpg", synthetic.encode(photo_like(i), "JPEG")) for i in range(40)]
    response = client.post("/api/v1/predict", **synthetic.multipart(*files, top_k="2"))
    assert response.status_code == 200
    predictions = response.get_json()["predictions"]
    assert [p["filename"] for p in predictions] == [f"{i}.jpg" for i in range(40)]
    assert all(len(p["top_k"]) == 2 for p in predictions)


@pytest.mark.parametrize(
    "body, content_type, status, words",
    [
        (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\n\r\nabc", "multipart/form-data; boundary=b", 400, "malformed"),
        (b"not multipart at all", "multipart/form-data; boundary=b", 400, "malformed"),
        (b"--b--\r\n", "multipart/form-data", 400, "no boundary"),
        (b"--b--\r\n", "multipart/form-data; boundary=b", 400, "no file parts"),
        (b"--b\r\nContent-Disposition: form-data; name=\"top_k\"\r\n\r\n2\r\n--b--\r\n", "multipart/form-data; boundary=b", 400, "no file parts"),
    ],
    ids=["unterminated", "garbage", "no-boundary", "no-parts", "fields-only"],
)
def test_bad_multipart_is_a_clear_4xx(client, body, content_type, status, words):
    response = client.post("/api/v1/predict", data=body, content_type=content_type)
    assert response.status_code == status
    assert words in response.get_json()["error"]


def test_a_part_without_even_an_empty_body_is_refused_clearly(client):
    """werkzeug's test client writes an empty file this way; real clients send the blank line."""
    response = client.post("/api/v1/predict", data={"file": (io.BytesIO(b""), "empty.png")})
    assert response.status_code == 400
    assert "malformed" in response.get_json()["error"]


def test_too_many_parts_is_413(client):
    response = client.post("/api/v1/predict", **synthetic.multipart(*[(f"{i}.png", b"x") for i in range(1001)]))
    assert response.status_code == 413
    assert "too large" in response.get_json()["error"]


def test_bad_multipart_on_the_form_is_a_page(client):
    response = client.post("/", data=b"garbage", content_type="multipart/form-data; boundary=b")
    assert response.status_code == 400
    assert b"The upload cannot be read" in response.data
