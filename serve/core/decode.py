"""Decode uploaded images in memory into the model's input: uint8 RGB, 32x32.

Only an allow-list of formats is opened, the pixel count is capped far below Pillow's
default, and Pillow's decompression-bomb warning is an error. Nothing touches the disk.
"""

import io
import struct
import warnings

import simplejpeg
from PIL import Image, UnidentifiedImageError

from contract import CHANNELS, IMAGE_SIZE
from contract.pixels import to_rgb32
from serve.core.errors import BadRequest, ServeError, TooLarge, Unsupported

#: Pillow format names accepted; GIFs give their first frame.
ALLOWED_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A bomb warning becomes an exception (filterwarnings is process-wide and idempotent; doing
# it per request with catch_warnings would not be thread-safe).
warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


def decode(data, max_pixels):
    """Return ``(pixels, format)``: uint8 ``[32, 32, 3]`` RGB and the Pillow format name.

    A plain JPEG (see ``_decode_plain_jpeg``) is decoded by libjpeg-turbo through simplejpeg,
    about ten times faster than through Pillow for the same pixels; everything else, and every
    error message, comes from Pillow.

    Raises:
      BadRequest: not an image, truncated, empty; TooLarge: too many pixels; Unsupported: a
        format outside ``ALLOWED_FORMATS``.
    """
    if IMAGE_SIZE * IMAGE_SIZE <= max_pixels and (pixels := _decode_plain_jpeg(data)) is not None:
        return pixels, "JPEG"
    return _decode_with_pillow(data, max_pixels)


def decode_many(datas, max_pixels):
    """``decode`` of each of ``datas``: a list of ``(pixels, format)`` or of the ``ServeError``."""
    results = []
    for data in datas:
        try:
            results.append(decode(data, max_pixels))
        except ServeError as e:
            results.append(e)
    return results


def declared_pixels(data):
    """The pixels ``data`` declares in its header, read without decoding it (0 when it names no size)."""
    if data[:3] == b"\xff\xd8\xff":
        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            return width * height
        except ValueError:
            pass  # Pillow may still read the header, or say why not when it decodes
    if data[:8] == _PNG_SIGNATURE and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])  # what Pillow reads there, without its chunk walk
        return width * height
    try:
        with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as image:  # reads the header only
            width, height = image.size
            return width * height
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        return 1 << 62  # over any cap: the decoder refuses it on its own
    except Exception:  # not an image, or a damaged header: decoding says which, and costs nothing
        return 0


def _decode_plain_jpeg(data):
    """uint8 ``[32, 32, 3]`` pixels of a JPEG that Pillow would decode to the same, else None.

    Plain: already 32x32, YCbCr or grey, no EXIF block (which may turn it) and no MPF block
    (an MPO, which Pillow names so), decoded without a single libjpeg warning (``strict``). Pillow
    and simplejpeg both run libjpeg-turbo with its defaults (accurate integer DCT, smooth chroma
    upsampling), so the pixels are Pillow's (``tests/serve/core/test_decode.py`` checks).
    """
    if data[:3] != b"\xff\xd8\xff":
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if (height, width) != (IMAGE_SIZE, IMAGE_SIZE) or colorspace not in ("YCbCr", "Gray"):
            return None
        if b"Exif\x00\x00" in data or b"MPF\x00" in data:
            return None
        return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    except ValueError:  # damaged or unusual: Pillow decides, and says what is wrong
        return None


def _decode_with_pillow(data, max_pixels):
    if not data:
        raise BadRequest("is empty")
    try:
        image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except UnidentifiedImageError:
        raise _why_unidentified(data) from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise TooLarge(f"has too many pixels ({e})") from None
    except Exception as e:  # Pillow raises many kinds on corrupt headers
        raise BadRequest(f"is not a readable image ({e})") from None
    with image:
        fmt = image.format
        width, height = image.size
        if width * height > max_pixels:
            raise TooLarge(f"has too many pixels ({width}x{height}; the limit is {max_pixels})")
        try:
            pixels = to_rgb32(image)  # the same rule as training's loaders (contract.pixels)
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
            raise TooLarge(f"has too many pixels ({e})") from None
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            # Truncated or corrupt data surfaces only when the pixels are decoded.
            raise BadRequest(f"is a damaged or truncated {fmt} image ({e})") from None
    if pixels.shape != (IMAGE_SIZE, IMAGE_SIZE, CHANNELS):
        raise BadRequest(f"decoded to an unexpected shape {pixels.shape}")
    return pixels, fmt


def _why_unidentified(data):
    """Tell a real image in a refused format (415) from data that is no image at all (400)."""
    try:
        with Image.open(io.BytesIO(data)) as other:
            fmt = other.format
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        return TooLarge("has too many pixels")
    except Exception:
        return BadRequest("is not an image (or not in a format this server reads)")
    return Unsupported(f"is a {fmt} image; accepted formats are {', '.join(ALLOWED_FORMATS)}")
