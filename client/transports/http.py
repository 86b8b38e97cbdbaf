"""The HTTP session the HTTP transports share: a total deadline for each exchange, answers read up to a cap, no
redirects followed, 429 and 503 sent again after ``Retry-After``."""

import datetime
import email.utils
import functools
import itertools
import math
import re
import time
from urllib.parse import urljoin, urlsplit

from client.transports.common import (DEFAULT_MAX_WAIT_S, DEFAULT_RETRIES, MAX_ANSWER_BYTES, RETRY_STATUSES, MalformedAnswer,
                                      RequestFailed, Unreachable, reason, server_text)

#: Waits between tries when the server gives no Retry-After: 0.5, 1, 2, 4 s... (at most the longest wait).
BACKOFF_S = 0.5


class Answer:
    """One HTTP answer, read whole: ``status_code``, ``reason``, ``headers`` and ``content`` (bytes), as requests names them."""

    def __init__(self, status_code, reason, headers, content):
        self.status_code, self.reason, self.headers, self.content = status_code, reason, headers, content


class HttpTransport:
    """What the HTTP transports share: one requests session, and unreachable or not-ready as :class:`Unreachable`.

    Each exchange (connecting, sending, reading the whole answer) must end within ``timeout``
    seconds, however slowly the server trickles (:mod:`.deadline`); past it the client gives up with
    :class:`Unreachable`. At most :data:`MAX_ANSWER_BYTES` of an answer are read (more is a
    :class:`MalformedAnswer`), and only in the identity coding. No redirect is followed, to this host
    or another: a 3xx is a :class:`RequestFailed` that names where it points.

    A 429 or 503 is sent again, the same request whole, after the server's ``Retry-After`` (at
    most ``max_wait_s`` a time; without the header, 0.5, 1, 2 s...), up to ``retries`` times; the
    last refusal is then the answer. Each try has its own deadline; the waits count in none.
    """

    def __init__(self, url, timeout, retries=DEFAULT_RETRIES, max_wait_s=DEFAULT_MAX_WAIT_S):
        import requests

        from client.transports.deadline import WatchedAdapter

        self._requests = requests
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.max_wait_s = max_wait_s
        self.session = _session_class()()
        # A compressed answer could hold far more than it weighs: ask for none (one that comes anyway is refused).
        self.session.headers["Accept-Encoding"] = "identity"
        for prefix in ("http://", "https://"):
            self.session.mount(prefix, WatchedAdapter())

    def _send(self, method, url, **kwargs):
        """The answer to ``method url``, read whole, after any retries a 429 or 503 asks for."""
        for attempt in itertools.count():
            answer = self._exchange(method, url, **kwargs)
            if answer.status_code not in RETRY_STATUSES or attempt >= self.retries:
                return answer
            wait = retry_after(answer.headers.get("Retry-After"))
            time.sleep(min(BACKOFF_S * 2**attempt if wait is None else wait, self.max_wait_s))

    def _exchange(self, method, url, **kwargs):
        """One try: the answer within the deadline and the size cap, or the reason why not."""
        import http.client

        import urllib3

        from client.transports.deadline import Exchange

        broken = (self._requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)
        per_operation = self.timeout if math.isfinite(self.timeout) else None
        response = answer = None
        with Exchange(self.timeout) as exchange:
            try:
                response = self.session.request(method, url, timeout=per_operation, stream=True, allow_redirects=False, **kwargs)
                redirect = 300 <= response.status_code < 400 and "Location" in response.headers
                content = b"" if redirect else self._read(response, url)
                answer = Answer(response.status_code, response.reason, response.headers, content)
            except broken as error:
                if not exchange.expired:
                    raise Unreachable(f"cannot reach {self.url}: {type(error).__name__}") from error
            except ValueError:
                if not exchange.expired:  # a socket shut under a TLS read can say so with a ValueError
                    raise
            finally:
                if response is not None:
                    response.close()
        if exchange.expired:
            raise Unreachable(f"no whole answer from {url} within {self.timeout:g} s (--timeout); gave up")
        if 300 <= answer.status_code < 400 and "Location" in answer.headers:
            raise _redirect_refused(url, answer)
        return answer

    def _read(self, response, url):
        """The body of ``response``, at most :data:`MAX_ANSWER_BYTES`, in the identity coding."""
        coding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if coding not in ("", "identity"):
            raise MalformedAnswer(f"{url} answered in the {server_text(coding)!r} coding; the client asks for none "
                                  "(Accept-Encoding: identity) and reads none")
        too_large = MalformedAnswer(f"the answer from {url} is larger than {MAX_ANSWER_BYTES // 2**20} MiB, the most "
                                    "the client reads (MAX_ANSWER_BYTES)")
        declared = response.headers.get("Content-Length", "").strip()
        if declared.isascii() and declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
            raise too_large
        chunks, size = [], 0
        while chunk := response.raw.read(64 * 1024, decode_content=False):
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise too_large
            chunks.append(chunk)
        response.raw.release_conn()  # read to its end: the connection may serve the next request
        return b"".join(chunks)

    def _raise_if_not_ready(self, response, body):
        if response.status_code == 503:
            raise Unreachable(f"{self.url} is not ready: {reason(body, response)}")


@functools.cache
def _session_class():
    """requests' Session, but it never looks where a redirect points (requests is imported when first needed)."""
    import requests

    class Session(requests.Session):
        def get_redirect_target(self, response):
            # None: redirects are the transport's to refuse (:func:`_redirect_refused`). requests would
            # otherwise read a redirect's whole body, whatever its size, even with allow_redirects=False.
            return None

    return Session


def _redirect_refused(url, answer):
    location = server_text(answer.headers["Location"])
    try:
        target = urljoin(url, location)
        here, there = urlsplit(url), urlsplit(target)
        same_host = (here.hostname, here.port or _PORTS.get(here.scheme)) == (there.hostname, there.port or _PORTS.get(there.scheme))
    except ValueError:  # not a URL at all (a bad port, a broken IPv6 literal)
        target, same_host = location, False
    if same_host:
        return RequestFailed(f"{url} redirects to {target} (HTTP {answer.status_code}); the client follows no "
                             "redirects: give --url the address the server names", answer.status_code)
    return RequestFailed(f"{url} redirects to {target}, another host (HTTP {answer.status_code}); the client follows "
                         "no redirects, and to another host it would send the images there: give --url that host "
                         "if you mean it", answer.status_code)


_PORTS = {"http": 80, "https": 443}


def retry_after(value):
    """The seconds a ``Retry-After`` header asks for (a number of seconds or an HTTP date), or None for none or garbage."""
    if value is None:
        return None
    value = value.strip()
    if re.fullmatch(r"\d{1,9}", value):
        return int(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
