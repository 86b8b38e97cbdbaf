"""JSON bodies whose tensor is read straight into NumPy: the same answer as ``json.loads``, several times sooner.

A 64-image TF Serving ``instances`` body is 196,608 integers. Parsed as JSON, each becomes a Python
``int`` in a list nested four deep, which NumPy then walks again to build the array: together about
four fifths of such a request's time in the server (docs/benchmarks.md). :func:`loads` reads the
body with orjson as always, except one value, the first array under ``key`` that holds only
non-negative integers: that is checked and converted with vectorised NumPy over its bytes, and
comes back as an integer array where ``orjson.loads`` would have put the nested lists.

The fast path takes nothing on trust. It applies only when the value is a rectangular array of
plain non-negative integers (digits, commas, brackets and white space; no leading zeros; at most
:data:`MAX_DIGITS` digits), checked against the exact brackets and commas such an array of that shape
must have, and when the rest of the body, with the value cut out, parses to an object that holds the cut
exactly once, where the value was. Anything else (floats, signs, strings, ``{"b64": ...}``,
ragged rows, a second copy of the key, invalid JSON anywhere) is parsed by orjson as a whole, so
every error and every odd case is the general path's, unchanged.
"""

import functools

import numpy as np
import orjson

#: The largest array whose canonical text is kept between requests (a 64-image batch is 196,608 numbers: about
#: 200 kB of brackets and commas); larger ones are written again each time, so the cache holds at most a few MB.
MAX_KEPT_NUMBERS = 1 << 18
#: Longest integer the fast path reads (the int32 it answers holds nine digits; the models take 0-255).
MAX_DIGITS = 9
#: The most dimensions the fast path reads.
MAX_RANK = 32
_OPEN, _CLOSE, _COMMA, _ZERO = ord("["), ord("]"), ord(","), ord("0")
_WHITE = b" \t\n\r"
_DIGITS = b"0123456789"
#: What the cut-out value is replaced with while the rest of the body is parsed; must occur once.
_CUT = "\x00tensor\x00"


def loads(body, keys, general=orjson.loads):
    """``general(body)``, but the first array of non-negative integers under the first of ``keys`` found is an integer array.

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
    """The integer array a JSON array of non-negative integers spells, or None when ``text`` is anything else.

    Rectangular means: with its numbers taken out, the text is exactly the brackets and commas of an array of its
    shape (read from where its first block at each depth ends, and sized by the numbers it holds before the canonical
    text is built); every number sits where that text has one (never just after a ``]`` nor just before a ``[``), and
    there are as many numbers as the shape holds, so each place has exactly one. Each step is one vectorised pass: a
    request of one image is 13 kB of text, where the passes' own overhead, not their bytes, is most of the cost.
    """
    text = bytes(text)
    compact = text.translate(None, _WHITE) if any(white in text for white in _WHITE) else text
    delimiters = compact.translate(None, _DIGITS)  # any other byte stays, and then differs from the canonical text
    shape = _shape(delimiters)  # None, or a shape whose canonical text is exactly as long as these delimiters
    if shape is None or delimiters != _canonical(shape):
        return None
    chars = np.frombuffer(compact, np.uint8)
    digits = chars - np.uint8(_ZERO)  # brackets and commas wrap around to 43 and up
    digit = digits < 10
    if len(compact) != len(text):
        # White space between two digits ends a number ("1 2" is not JSON): then taking the white
        # space out joins two runs of digits into one. Not for the fast path.
        spaced = (np.frombuffer(text, np.uint8) - np.uint8(_ZERO)) < 10
        if _runs(spaced) != _runs(digit):
            return None
    following, preceding = digit[1:], digit[:-1]
    if ((chars[:-1] == _CLOSE) & following).any() or (preceding & (chars[1:] == _OPEN)).any():
        return None  # a number just after "]" or just before "[": not where a number goes
    if ((chars[1:-1] == _ZERO) & digit[2:] & ~digit[:-2]).any():
        return None  # a number with a leading zero
    edges = np.flatnonzero(following != preceding)  # each number's first digit - 1 and last digit, in pairs
    last = edges[1::2]
    if len(last) != _size(shape):
        return None
    longest = int((last - edges[0::2]).max())
    if longest > MAX_DIGITS:
        return None
    # At every position, its digit and those before it in its number, each times its power of ten (a run of digits
    # is bounded by brackets and commas, which count 0); read at each number's last digit.
    weighted = np.multiply(digits, digit, dtype=np.int16 if longest <= 4 else np.int32)  # 9999 fits in an int16
    total, run, scale = weighted.copy(), None, 1
    for k in range(1, longest):  # the models' pixels have at most three digits: two more passes
        scale *= 10
        if k == 1:
            total[1:] += weighted[:-1] * scale
            continue
        run = digit[1:-1] if run is None else run[1:] & digit[1 : len(digit) - k + 1]  # digits at i-1 ... i-k+1
        total[k:] += weighted[:-k] * run * scale
    values = total.take(last)
    return values.reshape(shape)


def _shape(delimiters):
    """The shape an array's brackets and commas spell, from where its first block at each depth ends (None: no array).

    In the canonical text, the first block of depth k (1: an innermost row) ends where ``k`` closing brackets first
    follow one another; it is ``n + 1`` characters for ``n`` numbers at depth 1, and ``2 + n * L + (n - 1)`` for ``n``
    blocks of ``L`` characters deeper down; the whole text is the first (and only) block of depth ``rank``, so the shape
    is refused unless its length is the text's, before any canonical text is built. Only the canonical comparison that
    follows proves the text has that shape.
    """
    rank = len(delimiters) - len(delimiters.lstrip(b"["))
    if rank == 0 or rank > MAX_RANK:
        return None
    shape, block = [], 0
    for depth in range(1, rank + 1):
        end = delimiters.find(b"]" * depth, rank - depth)
        if end < 0:
            return None
        length = end - (rank - depth) + depth  # the first block of this depth, brackets included
        n, remainder = divmod(length - 1, block + 1) if block else (length - 1, 0)
        if remainder or n < 1:
            return None
        shape.append(n)
        block = length
    if block != len(delimiters):  # a ragged text can spell a huge shape in its first blocks: never build its text
        return None
    shape.reverse()
    return tuple(shape)


def _runs(mask):
    """How many runs of True ``mask`` holds."""
    return int(mask[0]) + int(np.count_nonzero(mask[1:] & ~mask[:-1]))


def _size(shape):
    size = 1
    for n in shape:
        size *= n
    return size


def _canonical(shape):
    """The brackets and commas of the JSON text of an array of ``shape``, without its numbers; the small ones are kept."""
    return _canonical_kept(shape) if _size(shape) <= MAX_KEPT_NUMBERS else _canonical_text(shape)


def _canonical_text(shape):
    text = b"[" + b"," * (shape[-1] - 1) + b"]"
    for n in reversed(shape[:-1]):
        text = b"[" + b",".join([text] * n) + b"]"
    return text


_canonical_kept = functools.lru_cache(maxsize=16)(_canonical_text)


def _place(value, array):
    """Put ``array`` where the cut is in ``value`` (parsed JSON); how many cuts were found.

    The cut was the value after ``"key":``, so it is the value of an object's member: only those are compared (a
    string equal to it elsewhere, in a list, is the client's own and stays). Lists are searched for objects only.
    """
    found = 0
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if v.__class__ is str:
                    if v == _CUT:
                        node[k] = array
                        found += 1
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        else:
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return found
