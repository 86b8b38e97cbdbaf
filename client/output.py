"""How the client writes what a server says on a terminal: every string escaped, one line each.

A server is not trusted to be polite: its labels, errors and metadata reach the terminal only through
:func:`printable`, so they can neither drive it (escape sequences) nor reorder or split a line.
"""

import json
import sys
import unicodedata

_ESCAPED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def printable(value):
    """``value`` as text with every control character (C0, DEL, C1: ESC among them), format character
    (bidirectional overrides, zero-width marks), line or paragraph separator and lone surrogate written
    as an escape (``\\x1b``, ``\\u202e``): what a server says can neither drive the terminal (move the
    cursor, recolour, retitle) nor reorder or split the line it is printed on."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in _ESCAPED_CATEGORIES else ch for ch in text)


def _escape(ch):
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def say(message):
    """One line on stderr, ``client: message``, escaped."""
    print(f"client: {printable(message)}", file=sys.stderr)


def format_top_k(entries):
    return ", ".join(f"{label(e)} {e['probability']:.3f}" for e in entries)


def label(entry):
    label = entry.get("label")
    return printable(label) if label is not None else f"#{entry.get('class_id')}"


def verdict(result):
    """The IN-DISTRIBUTION cell: yes, or no with the score, or ? where the model has no threshold."""
    inside, score = result.get("in_distribution"), result.get("ood_score")
    if inside is None:
        return "?" if score is None else f"? (score {score:.2f})"
    return "yes" if inside else f"NO (score {score:.2f})"


def text(value):
    """A value from the server as one escaped line: strings as they are, lists and objects as JSON."""
    return printable(json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value)


def names(value):
    return sorted(map(text, value)) if isinstance(value, (dict, list)) else [text(value)]
