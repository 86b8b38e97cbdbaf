"""Decoding uploads (serve/core/decode.py): the JPEG fast path gives Pillow's pixels, and Pillow's refusals."""

import io

import numpy as np
from PIL import Image

import synthetic
from serve.core import decode as imaging
from serve.core.errors import ServeError
from serve.settings import DEFAULT_MAX_PIXELS
from synthetic import photo_like


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
