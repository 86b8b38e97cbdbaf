"""Decode uploaded images in memory into the model's input: uint8 RGB, 32x32.

Only an allow-list of formats is opened, the pixel count is capped far below Pillow's
default, and Pillow's decompression-bomb warning is an error. Nothing touches the disk.
"""

import functools
import io
import sys
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from contract import CHANNELS, IMAGE_SIZE
from contract.pixels import to_rgb32
from serve.errors import ServeError

#: Pillow format names accepted; GIFs give their first frame.
ALLOWED_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
#: Most pixels an upload may declare (Pillow warns at ~89 M and refuses at ~179 M).
DEFAULT_MAX_PIXELS = 4096 * 4096
#: From this many images in one request, the plain ones are decoded by TensorFlow in one call.
BATCH_DECODE_MIN = 16

MIME_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "BMP": "image/bmp", "WEBP": "image/webp"}

# A bomb warning becomes an exception (filterwarnings is process-wide and idempotent; doing
# it per request with catch_warnings would not be thread-safe).
warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


def decode(data, max_pixels=DEFAULT_MAX_PIXELS):
    """Return ``(pixels, format)``: uint8 ``[32, 32, 3]`` RGB and the Pillow format name.

    Raises:
      ServeError: 400 (not an image, truncated, empty), 413 (too many pixels), 415 (a
        format outside ``ALLOWED_FORMATS``).
    """
    if not data:
        raise ServeError("is empty")
    try:
        image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except UnidentifiedImageError:
        raise ServeError(*_why_unidentified(data)) from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise ServeError(f"has too many pixels ({e})", 413) from None
    except Exception as e:  # Pillow raises many kinds on corrupt headers
        raise ServeError(f"is not a readable image ({e})") from None
    with image:
        fmt = image.format
        width, height = image.size
        if width * height > max_pixels:
            raise ServeError(f"has too many pixels ({width}x{height}; the limit is {max_pixels})", 413)
        try:
            pixels = to_rgb32(image)  # the same rule as training's loaders (contract.pixels)
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
            raise ServeError(f"has too many pixels ({e})", 413) from None
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            # Truncated or corrupt data surfaces only when the pixels are decoded.
            raise ServeError(f"is a damaged or truncated {fmt} image ({e})") from None
    if pixels.shape != (IMAGE_SIZE, IMAGE_SIZE, CHANNELS):
        raise ServeError(f"decoded to an unexpected shape {pixels.shape}")
    return pixels, fmt


def decode_many(datas, max_pixels=DEFAULT_MAX_PIXELS):
    """``decode`` of each of ``datas``: a list of ``(pixels, format)`` or of the ``ServeError``.

    From ``BATCH_DECODE_MIN`` images up, in a process that already runs TensorFlow (the
    ``savedmodel`` runtime; the others never import it), Pillow still reads every header, but
    the plain images (JPEG, or 8-bit PNG without transparency; RGB or grayscale; already 32x32;
    not turned by EXIF) are decoded together in one TensorFlow call, across cores and without
    holding the GIL. It uses Pillow's libjpeg settings (accurate integer DCT), so the pixels are the same
    (``tests/test_serve_uploads.py`` checks; the time saved is in docs/benchmarks.md). Everything
    else, and a whole batch that TensorFlow cannot
    decode, goes through ``decode``.
    """
    results = [None] * len(datas)
    plain = []
    if len(datas) >= BATCH_DECODE_MIN and IMAGE_SIZE * IMAGE_SIZE <= max_pixels and "tensorflow" in sys.modules:
        plain = [(index, fmt) for index, data in enumerate(datas) if (fmt := _plain_format(data))]
    if plain:
        import tensorflow as tf

        try:
            pixels = _batch_decoder()(tf.constant([datas[index] for index, _ in plain])).numpy()
        except tf.errors.OpError:  # damaged data Pillow did not see in the header: Pillow says which
            pixels = ()
        for (index, fmt), array in zip(plain, pixels):
            results[index] = (array, fmt)
    for index, data in enumerate(datas):
        if results[index] is None:
            try:
                results[index] = decode(data, max_pixels)
            except ServeError as e:
                results[index] = e
    return results


def _plain_format(data):
    """``"JPEG"`` or ``"PNG"`` when TensorFlow decodes ``data`` to what ``decode`` gives, else None."""
    try:
        with Image.open(io.BytesIO(data), formats=("JPEG", "PNG")) as image:
            if image.size != (IMAGE_SIZE, IMAGE_SIZE) or image.mode not in ("RGB", "L"):
                return None
            if image.format == "JPEG":
                # A JPEG's EXIF block is in its header: reading the orientation decodes nothing.
                return "JPEG" if image.getexif().get(ImageOps.ExifTags.Base.Orientation, 1) == 1 else None
            if image.format == "PNG":
                # 8 bits a sample (IHDR), no transparency to drop, no eXIf chunk (Pillow finds one
                # after the pixels only when it loads them), one frame.
                plain = data[24] == 8 and "transparency" not in image.info and b"eXIf" not in data
                return "PNG" if plain and not getattr(image, "is_animated", False) else None
    except Exception:  # decode() will say what is wrong with it
        return None
    return None  # MPO and other formats that Pillow's JPEG and PNG plugins also open


@functools.cache
def _batch_decoder():
    """A TensorFlow function: JPEG or PNG bytes ``[N]`` to uint8 ``[N, 32, 32, 3]``."""
    import tensorflow as tf

    shape = [IMAGE_SIZE, IMAGE_SIZE, CHANNELS]

    def one(data):
        image = tf.cond(
            tf.io.is_jpeg(data),
            lambda: tf.io.decode_jpeg(data, channels=CHANNELS, dct_method="INTEGER_ACCURATE"),
            lambda: tf.io.decode_png(data, channels=CHANNELS),
        )
        return tf.ensure_shape(image, shape)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def decode_batch(datas):
        return tf.map_fn(one, datas, fn_output_signature=tf.TensorSpec(shape, tf.uint8))

    return decode_batch


def _why_unidentified(data):
    """Tell a real image in a refused format (415) from data that is no image at all (400)."""
    try:
        with Image.open(io.BytesIO(data)) as other:
            fmt = other.format
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        return "has too many pixels", 413
    except Exception:
        return "is not an image (or not in a format this server reads)", 400
    return f"is a {fmt} image; accepted formats are {', '.join(ALLOWED_FORMATS)}", 415


def data_url(data, fmt):
    """An inline ``data:`` URL of the uploaded bytes, for showing them back on the page."""
    import base64

    return f"data:{MIME_TYPES.get(fmt, 'application/octet-stream')};base64,{base64.b64encode(data).decode('ascii')}"
