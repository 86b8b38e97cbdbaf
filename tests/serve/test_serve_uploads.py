"""How uploads are read: the multipart parser's refusals, and the JPEG fast path against Pillow."""

import io

import numpy as np
import pytest
from PIL import Image

import synthetic
from serve.core import decode as imaging
from serve.core.errors import ServeError
from serve.settings import DEFAULT_MAX_PIXELS


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


# -- the JPEG fast path --------------------------------------------------------------------


def _exif_rotated():
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90
    return synthetic.encode(photo_like(50), "JPEG", exif=exif.tobytes())


def _uploads():
    """Plain JPEGs that skip Pillow, and every kind that must still go through it."""
    plain = []
    for seed in range(6):
        image = Image.fromarray(photo_like(seed))
        for subsampling in (0, 1, 2):  # 4:4:4, 4:2:2, 4:2:0
            plain.append(synthetic.encode(image, "JPEG", quality=50 + 9 * seed, subsampling=subsampling))
    plain.append(synthetic.encode(Image.fromarray(photo_like(90)).convert("L"), "JPEG"))
    plain.append(synthetic.encode(photo_like(92), "JPEG", progressive=True, subsampling=2))
    plain.append(synthetic.encode(photo_like(93), "JPEG", optimize=True, restart_marker_blocks=1))
    mpo = io.BytesIO()
    Image.fromarray(photo_like(67)).save(mpo, "MPO", save_all=True, append_images=[Image.fromarray(photo_like(68))])
    pillow_only = [
        _exif_rotated(),
        mpo.getvalue(),  # Pillow names it MPO
        synthetic.encode(photo_like(60, size=48), "JPEG"),  # needs a resize
        synthetic.encode(Image.fromarray(photo_like(63)).convert("CMYK"), "JPEG"),
        synthetic.encode(photo_like(64), "PNG"),
        synthetic.encode(Image.fromarray(photo_like(61)).convert("P"), "PNG"),  # palette
        synthetic.encode(photo_like(65), "GIF"),
        synthetic.encode(photo_like(66), "BMP"),
    ]
    good = synthetic.encode(photo_like(80), "JPEG")
    broken = [
        b"", b"not an image", b"\xff\xd8\xff" + bytes(200), synthetic.encode(photo_like(70), "TIFF"),
        good[: len(good) - 200],  # the header is whole, the scan is cut short
    ]
    return plain, pillow_only, broken


def _through_pillow(monkeypatch):
    """The data that ``decode`` hands to Pillow, recorded."""
    seen = []
    real = imaging._decode_with_pillow
    monkeypatch.setattr(imaging, "_decode_with_pillow", lambda data, max_pixels: seen.append(data) or real(data, max_pixels))
    return seen


def _pillow_says(data, max_pixels=DEFAULT_MAX_PIXELS):
    try:
        return imaging._decode_with_pillow(data, max_pixels)
    except ServeError as e:
        return e


def test_plain_jpegs_skip_pillow_and_give_its_pixels(monkeypatch):
    plain, pillow_only, broken = _uploads()
    datas = plain + pillow_only + broken
    want = [_pillow_says(data) for data in datas]
    assert sum(isinstance(w, ServeError) for w in want) == len(broken)
    seen = _through_pillow(monkeypatch)
    for got, wanted in zip(imaging.decode_many(datas, DEFAULT_MAX_PIXELS), want, strict=True):
        if isinstance(wanted, ServeError):
            assert isinstance(got, ServeError) and (str(got), got.status) == (str(wanted), wanted.status)
        else:
            assert got[1] == wanted[1]
            np.testing.assert_array_equal(got[0], wanted[0])
    assert seen == pillow_only + broken  # and nothing plain


def test_a_pixel_limit_below_the_models_input_refuses_even_plain_jpegs(monkeypatch):
    plain, _, _ = _uploads()
    seen = _through_pillow(monkeypatch)
    results = imaging.decode_many(plain, max_pixels=100)
    assert seen == plain and all(r.status == 413 for r in results)
