"""How uploads are read: the multipart parser's refusals, and the batch decoder against Pillow."""

import io

import numpy as np
import pytest
from PIL import Image

import synthetic
from serve import images as imaging
from serve.errors import ServeError


def photo_like(seed, size=32):
    """Smooth colour gradients plus noise: every DCT coefficient matters, unlike flat synthetic shapes."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    base = np.stack([x, y, (x + y) / 2], axis=-1) * rng.uniform(80, 255, 3)
    return np.clip(base + rng.normal(0, 25, (size, size, 3)), 0, 255).astype(np.uint8)


# -- the multipart parser -----------------------------------------------------------------


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


# -- the batch decoder ----------------------------------------------------------------------


def _exif_rotated():
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90
    return synthetic.encode(photo_like(50), "JPEG", exif=exif.tobytes())


def _uploads():
    """Plain images TensorFlow decodes, and every kind that must still go through Pillow."""
    plain = []
    for seed in range(12):
        image = Image.fromarray(photo_like(seed))
        plain.append(synthetic.encode(image, "JPEG", quality=60 + 3 * seed))
        plain.append(synthetic.encode(image, "PNG"))
    plain.append(synthetic.encode(Image.fromarray(photo_like(90)).convert("L"), "JPEG"))
    plain.append(synthetic.encode(Image.fromarray(photo_like(91)).convert("L"), "PNG"))
    plain.append(synthetic.encode(photo_like(92), "JPEG", progressive=True, subsampling=2))
    plain.append(synthetic.encode(synthetic.make_images(1, seed=3)[0][0], "PNG"))
    pillow_only = [
        _exif_rotated(),
        synthetic.encode(photo_like(60, size=48), "JPEG"),  # needs a resize
        synthetic.encode(Image.fromarray(photo_like(61)).convert("P"), "PNG"),  # palette
        synthetic.encode(Image.fromarray(photo_like(62)).convert("RGBA"), "PNG"),  # alpha
        synthetic.encode(Image.fromarray(photo_like(63)).convert("CMYK"), "JPEG"),
        synthetic.encode(Image.fromarray((photo_like(64)[..., 0].astype(np.uint16) * 257)), "PNG"),  # 16-bit
        synthetic.encode(photo_like(65), "GIF"),
        synthetic.encode(photo_like(66), "BMP"),
    ]
    broken = [b"", b"not an image", synthetic.encode(photo_like(70), "TIFF")]
    return plain, pillow_only, broken


def _same(batch, one_by_one):
    for got, want in zip(batch, one_by_one, strict=True):
        if isinstance(want, ServeError):
            assert isinstance(got, ServeError) and (str(got), got.status) == (str(want), want.status)
        else:
            assert got[1] == want[1]
            np.testing.assert_array_equal(got[0], want[0])


def _one_by_one(datas):
    results = []
    for data in datas:
        try:
            results.append(imaging.decode(data))
        except ServeError as e:
            results.append(e)
    return results


def test_batch_decode_gives_pillows_pixels_and_only_plain_images_skip_pillow(monkeypatch):
    plain, pillow_only, broken = _uploads()
    datas = plain + pillow_only + broken
    assert len(datas) >= imaging.BATCH_DECODE_MIN
    want = _one_by_one(datas)

    through_pillow = []
    real_decode = imaging.decode
    monkeypatch.setattr(imaging, "decode", lambda data, max_pixels: through_pillow.append(data) or real_decode(data, max_pixels))
    _same(imaging.decode_many(datas), want)
    assert through_pillow == pillow_only + broken  # every plain image went to TensorFlow


def test_damaged_data_in_a_batch_is_named_and_the_rest_decoded():
    plain, _, _ = _uploads()
    good = synthetic.encode(photo_like(80), "JPEG")
    truncated = good[: len(good) - 200]  # the header is whole, the scan is cut short
    datas = plain[:20] + [truncated]
    results = imaging.decode_many(datas)
    assert isinstance(results[-1], ServeError) and results[-1].status == 400
    _same(results[:-1], _one_by_one(datas[:-1]))


def test_small_requests_and_tight_pixel_limits_use_pillow(monkeypatch):
    plain, _, _ = _uploads()
    calls = []
    real_decode = imaging.decode
    monkeypatch.setattr(imaging, "decode", lambda data, max_pixels: calls.append(data) or real_decode(data, max_pixels))
    imaging.decode_many(plain[: imaging.BATCH_DECODE_MIN - 1])
    assert len(calls) == imaging.BATCH_DECODE_MIN - 1
    calls.clear()
    results = imaging.decode_many(plain, max_pixels=100)
    assert len(calls) == len(plain) and all(r.status == 413 for r in results)
