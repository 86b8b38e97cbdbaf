"""What the transports share: the errors, the retry defaults, the HTTP session, and the result dict
every transport answers with (:func:`tfs_result` for the two that talk to TF Serving)."""

#: TF Serving reports the top class's name; the others are known only by id.
UNKNOWN_LABEL = None
#: Statuses that mean "not now": the request is sent again after the server's Retry-After.
RETRY_STATUSES = (429, 503)
DEFAULT_RETRIES = 3
#: The longest Retry-After a client waits out; a server asking for longer is waited on for this long.
DEFAULT_MAX_WAIT_S = 30.0


class Unreachable(Exception):
    """No server answers at the address, or it answers that it is not ready."""


class RequestFailed(Exception):
    """The server refused a request as a whole; ``status`` is its HTTP status (or gRPC code name)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def authorize(transport, api_key):
    """Send ``api_key`` as ``Authorization: Bearer`` on every request of an HTTP transport; return it.

    gRPC goes straight to TF Serving, which has no keys, so a key is not sent there."""
    session = getattr(transport, "session", None)
    if api_key and session is not None:
        session.headers["Authorization"] = f"Bearer {api_key}"
    return transport


def top_k_from_probabilities(probabilities, k, names):
    """[{label, class_id, probability}] for the ``k`` most probable classes, best first (:mod:`contract.ranking`)."""
    from contract.ranking import top_k

    order, best = top_k(probabilities, k)
    return [{"label": names.get(i, UNKNOWN_LABEL), "class_id": i, "probability": p} for i, p in zip(order.tolist(), best.tolist())]


class HttpTransport:
    """What the HTTP transports share: one requests session, and unreachable or not-ready as :class:`Unreachable`.

    A 429 or 503 is sent again, the same request whole, after the server's ``Retry-After`` (at
    most ``max_wait_s`` a time; without the header, 0.5, 1, 2 s...), up to ``retries`` times
    (urllib3's ``Retry``); the last refusal is then the answer.
    """

    def __init__(self, url, timeout, retries=DEFAULT_RETRIES, max_wait_s=DEFAULT_MAX_WAIT_S):
        import requests
        from requests.adapters import HTTPAdapter
        from urllib3.util import Retry

        self._requests = requests
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        retry = Retry(
            total=retries, connect=0, read=0, redirect=0, other=0, status=retries,
            status_forcelist=RETRY_STATUSES, allowed_methods=None,  # POST too: a refused request was not run
            respect_retry_after_header=True, retry_after_max=int(max_wait_s), backoff_factor=0.5,
            backoff_max=max_wait_s, raise_on_status=False,
        )
        for prefix in ("http://", "https://"):
            self.session.mount(prefix, HTTPAdapter(max_retries=retry))

    def _send(self, method, url, **kwargs):
        try:
            return self.session.request(method, url, timeout=self.timeout, **kwargs)
        except self._requests.RequestException as error:
            raise Unreachable(f"cannot reach {self.url}: {type(error).__name__}") from error

    def _raise_if_not_ready(self, response, body):
        if response.status_code == 503:
            raise Unreachable(f"{self.url} is not ready: {reason(body, response)}")


def json_or_none(response):
    """The response's JSON body, or None when it has none."""
    try:
        return response.json()
    except ValueError:
        return None


def reason(body, response):
    """Why the server refused: its ``error``, else the HTTP status line."""
    if isinstance(body, dict) and body.get("error"):
        return str(body["error"])
    return f"HTTP {response.status_code} {response.reason or ''}".strip()


def with_bad(batch, bad, predict_good):
    """One result per image of ``batch``: ``predict_good()`` for the decoded ones, an error for each of ``bad``."""
    good = predict_good() if len(bad) < len(batch) else []
    answers = iter(good)
    return [{"error": bad[i], "status": None} if i in bad else next(answers) for i in range(len(batch))]


def tfs_result(probabilities, class_id, top_k, names, ood_score=None, in_distribution=None):
    """One image's result from TF Serving's outputs for it; ``names`` maps the class ids seen so far to names."""
    probabilities = [float(p) for p in probabilities]
    return {
        "label": names.get(class_id),
        "class_id": class_id,
        "probability": probabilities[class_id],
        "top_k": top_k_from_probabilities(probabilities, top_k, names),
        "ood_score": None if ood_score is None else float(ood_score),
        "in_distribution": None if in_distribution is None else bool(in_distribution),
    }
