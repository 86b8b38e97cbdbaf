"""Training and serving turn the same file into the same pixels: one rule, contract.pixels.to_rgb32."""

import io

import numpy as np
import pytest
from PIL import Image

from serve.core import decode as serve_images
from train import data
from serve.settings import DEFAULT_MAX_PIXELS


def _rng():
    return np.random.default_rng(7)


def _exif_rotated_jpeg():
    image = Image.fromarray(_rng().integers(0, 255, (24, 40, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", exif=exif, quality=95)
    return buffer.getvalue()


def _save(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


CASES = {
    "rgb-32.png": lambda: _save(Image.fromarray(_rng().integers(0, 255, (32, 32, 3), dtype=np.uint8)), "PNG"),
    "exif-rotated.jpg": _exif_rotated_jpeg,
    "sixteen-bit.png": lambda: _save(Image.fromarray(_rng().integers(0, 65535, (32, 48), dtype=np.uint16)), "PNG"),
    "palette.png": lambda: _save(Image.fromarray(_rng().integers(0, 255, (50, 50, 3), dtype=np.uint8)).convert("P"), "PNG"),
    "alpha.png": lambda: _save(Image.fromarray(_rng().integers(0, 255, (32, 32, 4), dtype=np.uint8), "RGBA"), "PNG"),
    "grey.jpg": lambda: _save(Image.fromarray(_rng().integers(0, 255, (64, 64), dtype=np.uint8), "L"), "JPEG"),
    "cmyk.jpg": lambda: _save(Image.fromarray(_rng().integers(0, 255, (40, 40, 4), dtype=np.uint8), "CMYK"), "JPEG"),
    "grey-alpha.png": lambda: _save(Image.fromarray(_rng().integers(0, 255, (32, 32, 2), dtype=np.uint8), "LA"), "PNG"),
    "animated.gif": lambda: _save(Image.fromarray(_rng().integers(0, 255, (32, 32, 3), dtype=np.uint8)).convert("P"),
                                  "GIF", save_all=True,
                                  append_images=[Image.new("P", (32, 32), 3)]),
    "large.webp": lambda: _save(Image.fromarray(_rng().integers(0, 255, (96, 128, 3), dtype=np.uint8)), "WEBP"),
    "plain.bmp": lambda: _save(Image.fromarray(_rng().integers(0, 255, (32, 32, 3), dtype=np.uint8)), "BMP"),
}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Every case as a training file (class "a"), loaded by the training loader."""
    root = tmp_path_factory.mktemp("pixels")
    blobs = {name: make() for name, make in CASES.items()}
    for split in ("train", "test"):
        for cls in ("a", "b"):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for name, blob in blobs.items():
                (folder / name).write_bytes(blob)
    splits = data.load(str(root))
    by_name = dict(zip(sorted(blobs), splits.x_train[: len(blobs)]))
    return blobs, by_name


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_and_serving_give_identical_pixels(loaded, name):
    blobs, trained = loaded
    served, _ = serve_images.decode(blobs[name], DEFAULT_MAX_PIXELS)
    assert served.shape == (32, 32, 3) and served.dtype == np.uint8
    np.testing.assert_array_equal(trained[name], served)


def test_the_rule_applies_exif_orientation_and_scales_sixteen_bit(loaded):
    blobs, trained = loaded
    upright = np.asarray(Image.open(io.BytesIO(blobs["exif-rotated.jpg"])).convert("RGB").transpose(Image.Transpose.ROTATE_270)
                         .resize((32, 32), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(trained["exif-rotated.jpg"], upright)
    sixteen = np.asarray(Image.open(io.BytesIO(blobs["sixteen-bit.png"])))
    expected = np.asarray(Image.fromarray((sixteen // 257).astype(np.uint8), "L").convert("RGB")
                          .resize((32, 32), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(trained["sixteen-bit.png"], expected)
