"""An input as a protocol carried it (:class:`~serve.core.request.Tensor`) to the array its signature takes: one set of rules.

Every input of every protocol goes through :func:`read`, in this order, so each refusal is the same
whichever door it came by, and nothing is allocated before the shape that sizes it has passed:

1. the type the wire declares (if it declares one) is the signature's type;
2. the declared shape is whole numbers, its first dimension is within the image cap, the signature's
   rank and fixed sizes hold, and its values fit in what one request may carry;
3. the values are as many as the shape needs (packed bytes exactly; a flat list exactly, or fewer where
   TensorFlow's fill rule applies); strings are walked no further than the shape's count;
4. every value has the signature's type, and for integers its range: no ``true`` among numbers, no
   fractions or strings where integers go, no 300 or -1 for a ``uint8`` (TF Serving refuses all of these).
"""

import functools
import struct

import numpy as np
import orjson

from serve.core.errors import BadRequest, TooLarge, TooManyImages, echo
from serve.core.model import DTYPE_NAMES
from serve.core.request import BYTES, Upload

#: The most dimensions an input may have (numpy's own limit is 64).
MAX_RANK = 32
_KIND_NAMES = {"f": "fractions", "U": "strings", "S": "strings", "O": "mixed values", "b": "booleans", "i": "integers",
               "u": "integers"}


def read(key, tensor, spec, limits, names=None):
    """``tensor`` as the array ``spec`` (a :class:`~serve.core.model.TensorSpec`) takes; ``[Upload]`` for uploads.

    ``limits``: the service's :class:`~serve.core.service.Limits` (``max_images``, ``max_tensor_bytes``);
    ``names``: the protocol's name of each value type (numpy type -> name), for the refusals; TensorFlow's by default.
    """
    name = _namer(names)
    target = spec.numpy
    if target is None:
        raise BadRequest(f"input {echo(key)} is a {spec.dtype} tensor, which this server does not read")
    values = tensor.values
    if isinstance(values, (list, tuple)) and values and isinstance(values[0], Upload):
        _check_count(len(values), limits)
        _check_shape(key, (len(values),), spec)
        return list(values)
    if tensor.dtype is not None:
        declared = np.dtype(object) if tensor.dtype == BYTES else np.dtype(tensor.dtype)
        if declared != target:
            raise BadRequest(f"input {echo(key)} must have datatype {name(target)}, got {name(declared)}")
    if tensor.shape is not None:
        shape = _declared_shape(key, tensor.shape)
        _check_count(shape[0] if shape else 1, limits)
        count = _check_size(key, shape, target, limits)
        _check_shape(key, shape, spec)
        if tensor.packed:
            array = _packed(key, values, target, shape, count, tensor.field)
        else:
            array = _flat(key, values, target, shape, count, tensor.fill_last, name)
        return array.reshape(shape)
    array = _values(key, values, target, name)
    _check_count(array.shape[0] if array.ndim else 1, limits)
    _check_shape(key, array.shape, spec)
    return array


def count_of(tensor):
    """How many images ``tensor`` holds, as far as can be told without reading it (None: its values must say)."""
    values = tensor.values
    if isinstance(values, (list, tuple)) and values and isinstance(values[0], Upload):
        return len(values)
    if tensor.shape:
        first = tensor.shape[0]
        return first if isinstance(first, int) and not isinstance(first, bool) else None
    return len(values) if isinstance(values, (list, np.ndarray)) else None


def _check_count(count, limits):
    if count > limits.max_images:
        raise TooManyImages(f"the request holds {count} images; this server takes at most {limits.max_images} "
                            "per request (SERVE_MAX_IMAGES)")


def _declared_shape(key, shape):
    if (not isinstance(shape, (list, tuple)) or len(shape) > MAX_RANK
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise BadRequest(f"input {echo(key)}: shape must be a list of at most {MAX_RANK} non-negative whole numbers, "
                         f"got {_short(shape)}")
    return tuple(shape)


def _check_shape(key, shape, spec):
    """The signature's rank and fixed sizes (a batch of none is a batch: it is answered with none)."""
    want = spec.shape
    if want is not None and (len(shape) != len(want) or any(w >= 0 and w != s for w, s in zip(want, shape))):
        raise BadRequest(f"input {echo(key)} must have shape {list(want)}, got {_short(list(shape))}")


def _check_size(key, shape, target, limits):
    """The values the shape needs, when they fit in what one request may carry (a string counts as one byte at least)."""
    count = 1
    for size in shape:
        count *= size
    itemsize = 1 if target == object else target.itemsize
    if count * itemsize > limits.max_tensor_bytes:
        raise TooLarge(f"input {echo(key)} declares shape {list(shape)}, more than {limits.max_tensor_bytes} bytes: "
                       "more than one request may carry (SERVE_MAX_UPLOAD_MB)")
    return count


def _packed(key, data, target, shape, count, field):
    """Values packed little-endian in ``data`` (strings: v2's layout, a 4-byte length before each)."""
    if target == object:
        return _unpack_strings(key, data, count)
    need = count * target.itemsize
    if len(data) != need:
        raise BadRequest(f"input {echo(key)}: {field} holds {len(data)} bytes; shape {list(shape)} needs {need}")
    return np.frombuffer(data, target.newbyteorder("<")).astype(target, copy=False)


def _unpack_strings(key, data, count):
    """``count`` strings, each a little-endian uint32 length and its bytes; never walks past ``count`` of them."""
    view = memoryview(data)
    elements, offset = [], 0
    while offset < len(view) and len(elements) < count:
        if offset + 4 > len(view):
            raise BadRequest(f"input {echo(key)}: the data ends inside element {len(elements)}'s length")
        (size,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + size > len(view):
            raise BadRequest(f"input {echo(key)}: element {len(elements)} declares {size} bytes, but only "
                             f"{len(view) - offset} are left")
        elements.append(bytes(view[offset : offset + size]))
        offset += size
    if len(elements) != count or offset != len(view):
        more = "" if offset == len(view) else f" and {len(view) - offset} bytes more"
        raise BadRequest(f"input {echo(key)} has {len(elements)} elements{more}; its shape needs {count}")
    return _strings(key, elements)


def _flat(key, values, target, shape, count, fill_last, name):
    """``count`` values, flat or nested row-major (or, by TensorFlow's rule for its typed fields, fewer: the last repeats)."""
    array = _values(key, values, target, name).reshape(-1)
    given = array.size
    if given != count and not (fill_last and 0 < given < count):
        if target == object:
            raise BadRequest(f"input {echo(key)} has {given} elements; its shape needs {count}")
        raise BadRequest(f"input {echo(key)} has {given} values; shape {list(shape)} needs {count}")
    if given < count:
        array = np.concatenate([array, np.full(count - given, array[-1], dtype=array.dtype)])
    return array


def _values(key, values, target, name):
    """``values`` (a sequence, nested or flat, or an array a JSON reader made) as an array of ``target``: the right
    kind of value, within the type's range; a refusal names what was wrong."""
    if isinstance(values, (bytes, bytearray, memoryview, str)) or not hasattr(values, "__len__"):
        raise BadRequest(f"input {echo(key)}: its values must be a list, got {type(values).__name__}")
    if target == object:
        return _strings(key, values)
    if isinstance(values, np.ndarray):
        array = values
    else:
        try:
            array = np.asarray(values)
        except (ValueError, TypeError):
            _ragged(key)
        if array.dtype.kind in "iuf" and isinstance(values, list) and _holds_booleans(values):
            array = np.asarray(values, dtype=object)  # JSON's true and false are not numbers
    kind = array.dtype.kind
    if kind == "O" and array.size and any(isinstance(v, (list, tuple)) for v in array.flat):
        _ragged(key)
    if array.size == 0:
        return array.astype(target)
    got = _KIND_NAMES.get(kind, "other values")
    if target.kind in "iu":
        low, high = _bounds(target)
        if kind not in "iu":
            raise BadRequest(f"input {echo(key)} must hold whole numbers {low}..{high} ({name(target)}), got {got}")
        if not np.can_cast(array.dtype, target) and (array.min() < low or array.max() > high):
            raise BadRequest(f"input {echo(key)} has values outside the {name(target)} range {low}..{high}")
    elif target.kind == "f" and kind not in "iuf":
        raise BadRequest(f"input {echo(key)} must hold numbers ({name(target)}), got {got}")
    elif target.kind == "b" and kind != "b":
        raise BadRequest(f"input {echo(key)} must hold booleans ({name(target)}), got {got}")
    return array.astype(target, copy=False)


@functools.cache
def _bounds(dtype):
    """``(min, max)`` of an integer type."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _holds_booleans(values):
    """Whether lists that numpy read as numbers held JSON's ``true`` or ``false`` (numpy reads them as 1 and 0).

    Such lists hold numbers, and no strings or nulls (their array would not be numeric), so their JSON text
    holds the words ``true`` or ``false`` exactly when they hold a boolean: orjson writes it in one pass in C.
    """
    text = orjson.dumps(values)
    return b"true" in text or b"false" in text


def _strings(key, values):
    """An ``object`` array of ``bytes``, shaped as ``values`` nest: ``str`` values as UTF-8; anything else is refused."""
    try:
        array = np.array(values, dtype=object) if not isinstance(values, np.ndarray) else values.astype(object)
    except (ValueError, TypeError):
        _ragged(key)
    flat = array.reshape(-1)
    for index, value in enumerate(flat.tolist()):
        if isinstance(value, bytes):
            continue
        if isinstance(value, str):
            try:
                flat[index] = value.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate such as "\ud800", which JSON can spell and UTF-8 cannot
                raise BadRequest(f"input {echo(key)}: an element is not valid Unicode text (a lone surrogate)") from None
        elif isinstance(value, (list, tuple)):
            _ragged(key)
        else:
            raise BadRequest(f"input {echo(key)} must hold strings, got {type(value).__name__} values")
    return array


def _ragged(key):
    raise BadRequest(f"input {echo(key)} is ragged or not a tensor (its rows differ in length, or nest too deeply)")


def _namer(names):
    """How a protocol names a numpy type: ``names`` (numpy type -> name) where given, else TensorFlow's ``DT_*``."""
    def name(dtype):
        dtype = np.dtype(dtype)
        return (names or {}).get(dtype) or DTYPE_NAMES.get(dtype, str(dtype))

    return name


def _short(value):
    text = str(value)
    return text if len(text) <= 80 else text[:79] + "\u2026"
