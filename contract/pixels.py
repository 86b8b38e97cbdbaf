"""The one rule that turns an image into model input: uint8 RGB, 32x32, for training and serving alike.

Training's loaders (:mod:`train.data`) and the server (:mod:`serve.core.decode`) both call
:func:`to_rgb32` on the Pillow image they opened, so the same file gives the same pixels in both
(``tests/export/test_pixels.py`` checks formats and modes). The server's one exception, plain 32x32
JPEGs decoded by simplejpeg, gives the same pixels (``tests/serve/core/test_decode.py`` checks). Which files each stage accepts, and how it
reports a bad one, stays with the stage. Needs Pillow and NumPy; the client imports it only to
send pixels straight to TF Serving (:mod:`client.images`).
"""

import numpy as np
from PIL import Image, ImageOps

from contract import IMAGE_SIZE, RESIZE_METHOD

_RESAMPLE = {"bilinear": Image.Resampling.BILINEAR}[RESIZE_METHOD]
_SIXTEEN_BIT_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")


def to_rgb(image):
    """First frame, EXIF orientation applied, any mode (palette, L, LA, CMYK, 16-bit...) as RGB.

    16-bit values are scaled to 8 bits (divided by 257) when any exceeds 255; alpha is dropped,
    not composited, as the model's own ``predict_images`` signature does.
    """
    if getattr(image, "n_frames", 1) > 1:
        image.seek(0)
    # Reading the orientation tag is cheap; exif_transpose copies, so only call it when needed.
    if image.getexif().get(ImageOps.ExifTags.Base.Orientation, 1) != 1:
        image = ImageOps.exif_transpose(image)
    mode = image.mode
    if mode == "RGB":
        image.load()
        return image
    if mode in _SIXTEEN_BIT_MODES:
        values = np.asarray(image)
        if mode != "F" and values.max(initial=0) > 255:
            values = values // 257  # 16-bit range down to 8 bits
        return Image.fromarray(np.clip(values, 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode in ("PA", "La"):
        image = image.convert("RGBA")
    return image.convert("RGB")


def to_rgb32(image):
    """A Pillow image as the model's input: uint8 ``[32, 32, 3]`` RGB (``contract.RESIZE_METHOD`` to resize)."""
    image = to_rgb(image)
    if image.size != (IMAGE_SIZE, IMAGE_SIZE):
        image = image.resize((IMAGE_SIZE, IMAGE_SIZE), _RESAMPLE)
    return np.asarray(image, dtype=np.uint8)
