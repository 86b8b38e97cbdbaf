"""Encoded image files to the model's input, by the server's own rule, for the transports that skip the server.

Straight to TF Serving (``--via tfserving-rest``, ``--via tfserving-grpc``) there is no front end to
decode: the client decodes each file with :func:`contract.pixels.to_rgb32` (EXIF orientation,
Pillow's BILINEAR resize), the rule ``serve/images.py`` and training's loaders follow, and sends
uint8 pixels to ``serving_default``. The SavedModel's own ``predict_images`` graph decodes otherwise
(``tf.io.decode_image``, no EXIF), so a rotated photo would get another class there.
"""

import io

#: Formats the server accepts (serve.core.decode.ALLOWED_FORMATS); the client reads the same ones.
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
#: The server's default pixel cap (SERVE_MAX_PIXELS); a larger image is refused before it is decoded.
MAX_PIXELS = 4096 * 4096


class NotAnImage(ValueError):
    """A file the client cannot turn into pixels; the message says why."""


def pixels(data):
    """uint8 ``[32, 32, 3]`` RGB from the encoded bytes ``data``; raises :class:`NotAnImage`."""
    import warnings

    from PIL import Image

    from contract.pixels import to_rgb32

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=FORMATS) as image:
                width, height = image.size
                if width * height > MAX_PIXELS:
                    raise NotAnImage(f"has too many pixels ({width}x{height}; the limit is {MAX_PIXELS})")
                return to_rgb32(image)
    except NotAnImage:
        raise
    except Exception as error:  # Pillow raises many kinds for files that are not (whole) images
        raise NotAnImage(f"is not an image this client reads ({', '.join(FORMATS)}): {error}") from None


def decode_batch(batch):
    """``(pixels [n, 32, 32, 3] of the good files, {index: why} for the others)`` for ``[(name, bytes)]``."""
    import numpy as np

    good, bad = [], {}
    for index, (_, data) in enumerate(batch):
        try:
            good.append(pixels(data))
        except NotAnImage as error:
            bad[index] = str(error)
    return (np.stack(good) if good else np.zeros((0, 32, 32, 3), np.uint8)), bad
