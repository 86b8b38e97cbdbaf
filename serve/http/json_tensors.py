"""JSON bodies whose tensor is read straight into NumPy: the same answer as ``json.loads``, several times sooner.

A 64-image TF Serving ``instances`` body is 196,608 integers. Parsed as JSON, each becomes a Python
``int`` in a list nested four deep, which NumPy then walks again to build the array: together about
four fifths of such a request's time in the server (docs/benchmarks.md). :func:`loads` reads the
body with orjson as always, except one value, the first array under ``key`` that holds only
non-negative integers: that is checked and converted with vectorised NumPy over its bytes, and
comes back as an ``int64`` array where ``orjson.loads`` would have put the nested lists.

The fast path takes nothing on trust. It applies only when the value is a rectangular array of
plain non-negative integers (digits, commas, brackets and white space; no leading zeros; at most
:data:`MAX_DIGITS` digits), checked against the exact JSON text such an array of that shape must
have, and when the rest of the body, with the value cut out, parses to an object that holds the cut
exactly once, where the value was. Anything else (floats, signs, strings, ``{"b64": ...}``,
ragged rows, a second copy of the key, invalid JSON anywhere) is parsed by orjson as a whole, so
every error and every odd case is the general path's, unchanged.
"""

import functools

import numpy as np
import orjson

#: The largest array whose canonical text is kept between requests (a 64-image batch is 196,608 numbers: about
#: 400 kB of text); larger ones are written again each time, so the cache holds at most a few MB.
MAX_KEPT_NUMBERS = 1 << 18
#: Longest integer the fast path reads (int64 holds 18 digits; the models take 0-255).
MAX_DIGITS = 9
_OPEN, _CLOSE, _COMMA, _ZERO, _NINE = ord("["), ord("]"), ord(","), ord("0"), ord("9")
_WHITE = b" \t\n\r"
#: What the cut-out value is replaced with while the rest of the body is parsed; must occur once.
_CUT = "\x00tensor\x00"
_NUMBERS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")


def loads(body, keys, general=orjson.loads):
    """``general(body)``, but the first array of non-negative integers under the first of ``keys`` found is an int64 array.

    ``general`` (by default ``orjson.loads``; the server passes its JSON provider's, whose errors
    say more) reads every body the fast path does not take, so its errors are the errors.
    """
    if not isinstance(body, (bytes, bytearray)):
        return general(body)
    span = next((s for s in (_value_span(body, key) for key in ((keys,) if isinstance(keys, str) else keys)) if s), None)
    array = None if span is None else _integers(memoryview(body)[span[0] : span[1]])
    if array is None:
        return general(body)
    try:
        rest = orjson.loads(b"".join((body[: span[0]], orjson.dumps(_CUT), body[span[1] :])))
    except orjson.JSONDecodeError:
        return general(body)  # the body is not JSON after all: the general path's error
    placed = _place(rest, array)
    return rest if placed == 1 else general(body)


def _value_span(body, key):
    """Where the value after the first ``"key":`` starts and may end in ``body`` (before any string or object), or None."""
    at = body.find(b'"' + key.encode() + b'"')
    if at < 0:
        return None
    i = at + len(key) + 2
    while i < len(body) and body[i] in _WHITE:
        i += 1
    if i >= len(body) or body[i] != ord(":"):
        return None
    i += 1
    while i < len(body) and body[i] in _WHITE:
        i += 1
    if i >= len(body) or body[i] != _OPEN:
        return None
    # An array of numbers holds no string and no object: it ends before the next '"' or '}'.
    end = min((j for j in (body.find(b'"', i), body.find(b"}", i)) if j >= 0), default=len(body))
    return i, i + len(body[i:end].rstrip(_WHITE + b","))


def _integers(text):
    """The int64 array a JSON array of non-negative integers spells, or None when ``text`` is anything else."""
    text = bytes(text)
    # Any byte but digits, brackets, commas and white space stays in the skeleton below, which then
    # differs from the canonical text: no pass of its own looks for them.
    compact = text.translate(None, _WHITE) if any(white in text for white in _WHITE) else text
    chars = np.frombuffer(compact, np.uint8)
    digits = chars - np.uint8(_ZERO)  # brackets and commas wrap around to 43 and up
    digit = digits < 10
    if len(compact) != len(text):
        # White space between two digits ends a number ("1 2" is not JSON): then taking the white
        # space out joins two runs of digits into one. Not for the fast path.
        spaced = (np.frombuffer(text, np.uint8) - np.uint8(_ZERO)) < 10
        if _runs(spaced) != _runs(digit):
            return None
    starts = digit.copy()
    starts[1:] &= ~digit[:-1]
    ends = digit.copy()
    ends[:-1] &= ~digit[1:]
    first, last = starts.nonzero()[0], ends.nonzero()[0]  # flatnonzero without its Python-level ravel
    if first.size == 0:
        return None
    lengths = last - first + 1
    longest = int(lengths.max())
    leading = digits.take(first)  # take: a plain gather, cheaper than fancy indexing
    if longest > MAX_DIGITS or ((leading == 0) & (lengths > 1)).any():
        return None
    # Every number as one "0": the text must then be exactly the canonical text of its shape.
    skeleton = chars[~digit | starts].tobytes().translate(_NUMBERS_AS_ZERO)
    shape = _shape(skeleton)
    # The shape read from the first rows must hold exactly the numbers the text holds before its canonical text
    # is built: a ragged body of a few bytes may spell the first rows of a shape of billions.
    if shape is None or _size(shape) != first.size or skeleton != _canonical(shape):
        return None
    values = leading.astype(np.int64)
    for j in range(1, longest):  # the models' pixels have at most three digits: three passes
        more = lengths > j
        values = np.where(more, values * 10 + digits.take(first + j, mode="clip"), values)
    return values.reshape(shape)


def _runs(mask):
    """How many runs of True ``mask`` holds."""
    return int(mask[0]) + int(np.count_nonzero(mask[1:] & ~mask[:-1]))


def _shape(skeleton):
    """The shape a rectangular array's skeleton (numbers as ``0``) has, read from its first elements."""
    rank = len(skeleton) - len(skeleton.lstrip(b"["))
    if rank == 0 or rank > 32:
        return None
    shape = []
    for depth in range(1, rank + 1):
        end = skeleton.find(b"]" * (rank - depth + 1))
        span = skeleton[depth:end]
        shape.append(span.count(b"[" * (rank - depth)) if depth < rank else span.count(b"0"))
    return tuple(shape)


def _size(shape):
    size = 1
    for n in shape:
        size *= n
    return size


def _canonical(shape):
    """The JSON text of an array of zeros of ``shape``, written without spaces; the small ones are kept."""
    return _canonical_kept(shape) if _size(shape) <= MAX_KEPT_NUMBERS else _canonical_text(shape)


def _canonical_text(shape):
    text = b"[" + b",".join([b"0"] * shape[-1]) + b"]"
    for n in reversed(shape[:-1]):
        text = b"[" + b",".join([text] * n) + b"]"
    return text


_canonical_kept = functools.lru_cache(maxsize=16)(_canonical_text)


def _place(value, array):
    """Put ``array`` where the cut is in ``value`` (parsed JSON); how many cuts were found."""
    found = 0
    stack = [value]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in list(items):
            if isinstance(v, str):
                if v == _CUT:
                    node[k] = array
                    found += 1
            elif isinstance(v, (dict, list)):
                stack.append(v)
    return found
