"""What the transports share: the errors, the retry defaults, the reading of answers, and the result dict
every transport answers with (:func:`tfs_result` for the two that talk to TF Serving). The HTTP
session they share is :mod:`.http`.

A server is not trusted to be well behaved. Over HTTP every exchange has a total deadline (connect,
send, and the whole answer: :mod:`.deadline`), an answer is read up to :data:`MAX_ANSWER_BYTES` and
no further, no redirect is followed (to another host the images would be sent there), and an answer
that is not what its protocol says (not JSON, NaN, a field of the wrong type, a count that does not
match the request) is a :class:`MalformedAnswer` that names what is wrong, never an exception from
deep inside. What the server says is passed on as it said it (cut to :data:`MAX_SERVER_TEXT`
characters); the CLI escapes control characters before anything reaches the terminal.
"""

import contextlib
import json
import math

#: TF Serving reports the top class's name; the others are known only by id.
UNKNOWN_LABEL = None
#: Statuses that mean "not now": the request is sent again after the server's Retry-After.
RETRY_STATUSES = (429, 503)
DEFAULT_RETRIES = 3
#: The longest Retry-After a client waits out; a server asking for longer is waited on for this long.
DEFAULT_MAX_WAIT_S = 30.0
#: The most the client reads of one answer, over HTTP and gRPC. A legitimate answer is far smaller:
#: about 1 KiB per image on this server's API (256 images at most by default), less over v2 and TF
#: Serving, a few KiB for the model's metadata.
MAX_ANSWER_BYTES = 16 * 2**20
#: A server's error message, reason phrase or redirect target is cut to this many characters.
MAX_SERVER_TEXT = 500


class Unreachable(Exception):
    """No server answers at the address, it does not answer in time, or it answers that it is not ready."""


class RequestFailed(Exception):
    """The server refused a request as a whole; ``status`` is its HTTP status (or gRPC code name)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class MalformedAnswer(RequestFailed):
    """The server answered, but not as its protocol says (or more than :data:`MAX_ANSWER_BYTES`); the message says what."""


class Malformed(ValueError):
    """One part of an answer that is not what the protocol says; the message names it (see :func:`parsing`)."""


def authorize(transport, api_key):
    """Send ``api_key`` as ``Authorization: Bearer`` on every request of ``transport``; return it.

    HTTP transports send it as a header of their session; gRPC ones as call metadata (``authorization``),
    which this project's server reads and TF Serving ignores."""
    if not api_key:
        return transport
    session = getattr(transport, "session", None)
    if session is not None:
        session.headers["Authorization"] = f"Bearer {api_key}"
    elif hasattr(transport, "metadata"):
        transport.metadata = (("authorization", f"Bearer {api_key}"),)
    return transport


def top_k_from_probabilities(probabilities, k, names):
    """[{label, class_id, probability}] for the ``k`` most probable classes, best first (:mod:`contract.ranking`)."""
    from contract.ranking import top_k

    order, best = top_k(probabilities, k)
    return [{"label": names.get(i, UNKNOWN_LABEL), "class_id": i, "probability": p} for i, p in zip(order.tolist(), best.tolist())]


def parse_json(content):
    """The standard JSON in ``content``; :class:`ValueError` for anything else (``NaN``, ``Infinity``, a
    number too large for a float, nesting too deep to parse, bytes that are not text)."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    def finite(text):
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{text[:40]} is too large a number")
        return value

    try:
        return json.loads(content, parse_constant=refuse, parse_float=finite)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def json_or_none(response):
    """The response's JSON body, or None when it has none."""
    try:
        return parse_json(response.content)
    except ValueError:
        return None


def server_text(value):
    """Something a server said, as text of at most :data:`MAX_SERVER_TEXT` characters (escaped only when printed)."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= MAX_SERVER_TEXT else text[:MAX_SERVER_TEXT] + "..."


def reason(body, response):
    """Why the server refused: its ``error``, else the HTTP status line."""
    if isinstance(body, dict) and body.get("error"):
        return server_text(body["error"])
    return f"HTTP {response.status_code} {server_text(response.reason or '')}".strip()


@contextlib.contextmanager
def parsing(source):
    """Turn whatever goes wrong while an answer from ``source`` is read apart into one :class:`MalformedAnswer`."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError, RecursionError) as error:
        raise MalformedAnswer(f"malformed answer from {source}: {_describe(error)}") from None


def _describe(error):
    if isinstance(error, Malformed):
        text = str(error)
    elif isinstance(error, KeyError):
        text = f"no {server_text(str(error.args[0]) if error.args else '')!r}"
    else:
        text = f"{type(error).__name__}: {error}"
    return server_text(text)


def kind(value):
    """What a JSON value is, in words, for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        try:
            return f"the number {value!r}"[:60]
        except ValueError:  # an int of more digits than Python prints
            return "a number too large"
    if isinstance(value, str):
        return f"the string {server_text(value)[:40]!r}"
    return {list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def field(body, key, expected, path="the answer"):
    """``body[key]``, checked to be an ``expected`` (``dict`` or ``list``); :class:`Malformed` naming it otherwise."""
    if not isinstance(body, dict):
        raise Malformed(f"{path} is {kind(body)}, not an object")
    if key not in body:
        raise Malformed(f"{path} has no {key!r}")
    value = body[key]
    if not isinstance(value, expected):
        raise Malformed(f"{path}.{key} is {kind(value)}, not {'an object' if expected is dict else 'a list'}")
    return value


def number(value, path, optional=False):
    """``value`` as a finite float; :class:`Malformed` naming ``path`` otherwise (None passes when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            if math.isfinite(value := float(value)):
                return value
        except OverflowError:  # an int too large for a float
            pass
    raise Malformed(f"{path} is {kind(value)}, not a number")


def whole(value, path, optional=False):
    """``value`` as an int; :class:`Malformed` naming ``path`` otherwise (None passes when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{path} is {kind(value)}, not a whole number")
    return value


def text_or_none(value, path):
    if value is not None and not isinstance(value, str):
        raise Malformed(f"{path} is {kind(value)}, not a string")
    return value


def flag_or_none(value, path):
    """True, False or None; 1 and 0 are read as true and false."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise Malformed(f"{path} is {kind(value)}, not true or false")


def checked(result, path):
    """One image's result (label, class_id, probability, top_k, ood_score, in_distribution), each of the
    type the CLI prints; :class:`Malformed` naming the first that is not."""
    if not isinstance(result, dict):
        raise Malformed(f"{path} is {kind(result)}, not an object")
    top_k = result.get("top_k")
    if top_k is not None and not isinstance(top_k, list):
        raise Malformed(f"{path}.top_k is {kind(top_k)}, not a list")
    ranked = []
    for i, entry in enumerate(top_k or []):
        where = f"{path}.top_k[{i}]"
        if not isinstance(entry, dict):
            raise Malformed(f"{where} is {kind(entry)}, not an object")
        ranked.append({"label": text_or_none(entry.get("label"), f"{where}.label"),
                       "class_id": whole(entry.get("class_id"), f"{where}.class_id", optional=True),
                       "probability": number(entry.get("probability"), f"{where}.probability")})
    return {
        "label": text_or_none(result.get("label"), f"{path}.label"),
        "class_id": whole(result.get("class_id"), f"{path}.class_id", optional=True),
        "probability": number(result.get("probability"), f"{path}.probability"),
        "top_k": ranked,
        "ood_score": number(result.get("ood_score"), f"{path}.ood_score", optional=True),
        "in_distribution": flag_or_none(result.get("in_distribution"), f"{path}.in_distribution"),
    }


def with_bad(batch, bad, predict_good):
    """One result per image of ``batch``: ``predict_good()`` for the decoded ones, an error for each of ``bad``."""
    good = predict_good() if len(bad) < len(batch) else []
    if len(good) != len(batch) - len(bad):
        raise Malformed(f"{len(good)} results for {len(batch) - len(bad)} images")
    answers = iter(good)
    return [{"error": bad[i], "status": None} if i in bad else next(answers) for i in range(len(batch))]


def tfs_result(probabilities, class_id, top_k, names, ood_score=None, in_distribution=None, path="the answer"):
    """One image's result from TF Serving's outputs for it; ``names`` maps the class ids seen so far to names."""
    if not isinstance(probabilities, list) or not probabilities:
        raise Malformed(f"{path}.probabilities is {kind(probabilities)}, not a list of numbers")
    probabilities = [number(p, f"{path}.probabilities[{i}]") for i, p in enumerate(probabilities)]
    class_id = whole(class_id, f"{path}.class_ids")
    if not 0 <= class_id < len(probabilities):
        raise Malformed(f"{path}.class_ids is {class_id}, not one of the {len(probabilities)} classes")
    return checked({
        "label": names.get(class_id),
        "class_id": class_id,
        "probability": probabilities[class_id],
        "top_k": top_k_from_probabilities(probabilities, top_k, names),
        "ood_score": number(ood_score, f"{path}.ood_score", optional=True),
        "in_distribution": flag_or_none(in_distribution, f"{path}.in_distribution"),
    }, path)
