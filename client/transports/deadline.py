"""A total deadline for one HTTP exchange: connecting, sending, and reading the whole answer.

requests' ``timeout`` bounds each socket operation, not the exchange: a server that sends one byte
a second holds a client for ever. So every connection the session's adapter (:class:`WatchedAdapter`)
opens is watched: while an exchange runs (``with Exchange(seconds) as exchange:``), the
sockets it uses are noted, and when its time is up a timer shuts them down. The read
or write blocked on one ends at once with an error, and ``exchange.expired`` says why: the caller
reports a deadline, not a broken connection. A close-delimited answer cut short this way looks
whole to urllib3, so the caller must check ``exchange.expired`` after a success as well.

The timer takes a lock that the exchange's end takes too, so it never touches a socket after the
exchange is over (back in the pool, the next exchange may be using it).
"""

import math
import socket
import threading

from requests.adapters import HTTPAdapter

_local = threading.local()


class Exchange:
    """One exchange's deadline, ``seconds`` from ``__enter__`` (none when ``seconds`` is None or infinite)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.expired = False
        self._done = False
        self._lock = threading.Lock()
        self._sockets = []
        self._timer = None

    def __enter__(self):
        if self.seconds is not None and math.isfinite(self.seconds):
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()
        _local.exchange = self
        return self

    def __exit__(self, *exc_info):
        _local.exchange = None
        with self._lock:
            self._done = True
            self._sockets.clear()
        if self._timer is not None:
            self._timer.cancel()
        return False

    def watch(self, sock):
        """Note ``sock`` as used by this exchange; shut it at once if the time is already up.

        Sockets are kept, not connections: http.client lets go of its socket (``sock = None``) as soon as
        an answer's headers say the connection closes after it, and the answer reads on from it."""
        with self._lock:
            if self._done or sock is None:
                return
            if not any(s is sock for s in self._sockets):
                self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def _expire(self):
        with self._lock:
            if self._done:
                return
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading or writing it; close() would not
    except (OSError, ValueError, AttributeError):  # closed already
        pass


def _watch(sock):
    exchange = getattr(_local, "exchange", None)
    if exchange is not None:
        exchange.watch(sock)


class _Watched:
    """Mixed into urllib3's connection classes: the running exchange notes every socket they use."""

    def _new_conn(self):
        sock = super()._new_conn()
        _watch(sock)  # the plain socket, so that a TLS handshake is under the deadline too
        return sock

    def connect(self):
        super().connect()
        _watch(self.sock)  # the TLS socket that wraps it, if any

    def request(self, *args, **kwargs):
        _watch(self.sock)  # a connection reused from the pool
        return super().request(*args, **kwargs)

    def getresponse(self, *args, **kwargs):
        _watch(self.sock)
        return super().getresponse(*args, **kwargs)


_watched_pools = {}


def _watched_pool(pool_class):
    if getattr(pool_class, "_client_watched", False):
        return pool_class
    if pool_class not in _watched_pools:
        connection_class = type(f"Watched{pool_class.ConnectionCls.__name__}", (_Watched, pool_class.ConnectionCls), {})
        _watched_pools[pool_class] = type(
            f"Watched{pool_class.__name__}", (pool_class,), {"ConnectionCls": connection_class, "_client_watched": True}
        )
    return _watched_pools[pool_class]


def _watch_pools(manager):
    manager.pool_classes_by_scheme = {scheme: _watched_pool(cls) for scheme, cls in manager.pool_classes_by_scheme.items()}
    return manager


class WatchedAdapter(HTTPAdapter):
    """requests' adapter, with every connection it opens (directly or through a proxy) watched."""

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        _watch_pools(self.poolmanager)

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        return _watch_pools(super().proxy_manager_for(proxy, **proxy_kwargs))
