"""gunicorn settings: ``gunicorn -c python:serve.gunicorn_conf "serve:create_app()"``.

Layout for a small CPU machine: two worker processes (one on a single core), 16 threads each.
The model runs on its runtime's own threads (``SERVE_RUNTIME_THREADS``); the request threads
parse, decode and wait on their worker's micro-batcher. A second process gives request handling
a second GIL: on 2 cores two workers beat one on the medians of nine benchmark rounds at 1, 32
and 2 (64-image) concurrent clients, if less steadily at 32 (docs/benchmarks.md). Each worker
loads the model.
``WEB_CONCURRENCY`` sets the processes, ``GUNICORN_THREADS`` the threads per process; serve/README.md
lists every variable read here.
"""

import os
import shutil
import sys
import tempfile

from gunicorn.http import wsgi

from serve import settings

try:
    _settings = settings.process()  # read once, here in the arbiter; the workers are forked with it
except settings.SettingsError as e:  # one line naming the variable, before any worker starts
    print(f"serve: {e}", file=sys.stderr)
    sys.exit(2)

bind = f"{_settings.host}:{_settings.port}"
workers = _settings.web_concurrency
threads = _settings.gunicorn_threads
worker_class = "gthread"
# Loading TensorFlow and the SavedModel takes a while; never fork after importing TensorFlow.
timeout = _settings.gunicorn_timeout
graceful_timeout = 20
keepalive = 5
preload_app = False
# gunicorn 25.1+ serves a control socket (gunicornc) under $HOME/.gunicorn; nothing here uses it, and the
# image's user has no home ("Control server error: [Errno 13] Permission denied: '/home/app'").
control_socket_disable = True
accesslog = _settings.gunicorn_accesslog  # "-" for stdout; off by default (serve.access logs every request)
errorlog = "-"
loglevel = _settings.gunicorn_loglevel
# gunicorn's own lines (and its access log, when on) in SERVE_LOG_FORMAT, like the app's (serve/logs.py).
from serve.telemetry.logs import gunicorn_logger  # noqa: E402  (after the settings check above)

logger_class = gunicorn_logger(_settings.log_format)

# Prometheus multiprocess mode: every worker writes its metrics to files in one directory,
# and /metrics adds them up. The directory must be empty when the server starts.
_own_prometheus_dir = None if _settings.prometheus_multiproc_dir else tempfile.mkdtemp(prefix="serve-prometheus-")
if _own_prometheus_dir:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _own_prometheus_dir
else:
    _dir = _settings.prometheus_multiproc_dir
    os.makedirs(_dir, exist_ok=True)
    for _name in os.listdir(_dir):
        if _name.endswith(".db"):
            os.remove(os.path.join(_dir, _name))


# glibc gives every thread that allocates its own malloc arena (up to 8 per core): under a
# minute of mixed uploads from 64 clients the workers' resident memory grew by a third and was
# still creeping after two minutes; with two arenas it grew 5% and levelled off (bench/serving/soak.py,
# docs/benchmarks.md). glibc reads MALLOC_ARENA_MAX from the environment when a process starts,
# before any Python runs, so it is set where the process is started: `python -m serve` sets 2
# unless it is given, and so does the image. Here it can only be noticed missing.
MALLOC_ARENAS = 2


def post_worker_init(worker):
    # gunicorn answers requests it cannot parse (400, 414, 431...) itself, in HTML, before any
    # WSGI app or middleware sees them, and has no setting, hook or documented way to change that
    # page: replacing util.write_error, which its workers call for it, is the only way. Every
    # other error of this server is JSON, so these are too (tests/serve/test_hostile.py checks each).
    from gunicorn import util

    util.write_error = _write_json_error
    wsgi.Response = OneSendResponse  # what wsgi.create builds for every HTTP/1 request
    if _settings.grpc_port:
        _start_grpc(worker)


class OneSendResponse(wsgi.Response):
    """gunicorn's answer with its head sent in the same ``sendall`` as its body's first bytes.

    gunicorn sends an answer's status line and headers, then its body, in two sends. A worker killed
    between them (SIGKILL, an OOM kill, a lost node) leaves nginx holding a head it has already passed
    to the client: it cannot resend the request to another replica, and the client gets a broken
    answer (tests/deploy/test_replicas.py met it). Sent whole, an answer that fits the socket's buffer
    is lost whole (nginx resends the request) or not at all. The head is held from ``send_headers``
    (which ``write`` calls first) until the first body bytes or ``close``."""

    head = None

    def send_headers(self):
        if not self.headers_sent:
            lines = self.default_headers() + [f"{name}: {value}\r\n" for name, value in self.headers]
            self.head = ("".join(lines) + "\r\n").encode("latin-1")
            self.headers_sent = True

    def _emit_body(self, data):  # gunicorn's hook for how body bytes go on the wire
        if self.chunked:
            data = b"%X\r\n%s\r\n" % (len(data), data)
        head, self.head = self.head or b"", None
        self.sock.sendall(head + data)

    def close(self):
        self.send_headers()
        if self.head:  # no body bytes came (HEAD, 204, 304, an empty body)
            self.sock.sendall(self.head)
            self.head = None
        super().close()

    def sendfile(self, respiter):
        return False  # gunicorn's sendfile writes the head itself: the file goes through write() instead


def _start_grpc(worker):
    """TF Serving's gRPC API in this worker, over its app's service (docs/serving.md, "gRPC"): every worker
    binds GRPC_PORT with SO_REUSEPORT and the kernel spreads the connections. Not in the arbiter: gRPC must
    not start before a fork. A port that cannot be bound stops the worker's boot, and with it the server."""
    from serve.grpc import server as grpc_server

    address = grpc_server.bind_address(_settings.host, _settings.grpc_port)
    server, _ = grpc_server.make_server(worker.wsgi, address, threads=_settings.gunicorn_threads)
    server.start()
    worker.serve_grpc = server
    worker.log.info("gRPC (TF Serving's API, health) on %s in worker %s", address, worker.pid)


def worker_exit(server, worker):
    running = getattr(worker, "serve_grpc", None)
    if running is not None:  # the calls under way finish (up to their grace), new ones are refused
        from serve.grpc import server as grpc_server

        running.stop(grpc_server.STOP_GRACE_S).wait()
    from serve.telemetry import tracing

    tracing.shutdown()  # the spans still buffered are exported (the provider was built in this worker)


def _write_json_error(sock, status_int, reason, mesg):
    """gunicorn's ``util.write_error``, answering ``{"error": ...}`` instead of an HTML page."""
    import json

    from gunicorn import util

    body = json.dumps({"error": f"{reason}: {mesg}" if mesg else reason}).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"X-Content-Type-Options: nosniff\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


def when_ready(server):
    host, _, port = bind.rpartition(":")
    browsable = "localhost" if host in ("0.0.0.0", "::", "[::]", "") else host  # nosec B104  # a comparison, binds nothing
    server.log.info("listening on %s; open http://%s:%s/ (ready when /readyz says so)", bind, browsable, port)
    if _settings.grpc_port:
        server.log.info("gRPC (TF Serving's PredictionService and ModelService, grpc.health.v1) on port %d", _settings.grpc_port)
    if _settings.malloc_arena_max is None:
        server.log.warning("MALLOC_ARENA_MAX is not set: each worker's threads may fill %d malloc arenas a core and "
                           "grow; start with python -m serve, or set MALLOC_ARENA_MAX=%d", 8, MALLOC_ARENAS)


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _own_prometheus_dir:
        shutil.rmtree(_own_prometheus_dir, ignore_errors=True)
