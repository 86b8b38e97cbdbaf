"""granian, the other HTTP server: ``SERVE_SERVER=granian python -m serve`` (docs/serving.md, "The HTTP server").

granian (Rust, hyper) serves the same WSGI app in ``--interface wsgi`` mode: its workers are processes, its
"blocking threads" run the app (``GUNICORN_THREADS`` of them), and it takes at most that many requests at once a
worker (backpressure), leaving the rest in the kernel's backlog. What gunicorn's hooks do (serve/gunicorn_conf.py)
is done here, in each worker, by the factory granian calls there: the settings checked, the metrics' multiprocess
folder shared and the files of workers gone removed, and TF Serving's and the Open Inference Protocol's gRPC server
started beside HTTP on ``GRPC_PORT`` and stopped with the worker.

Typical usage (what ``python -m serve`` runs when ``SERVE_SERVER=granian``)::

    granian --interface wsgi --factory --workers 2 --blocking-threads 16 serve.granian_conf:app
"""

import atexit
import os
import re

from serve import settings

#: The granian command line for these settings; the target, ``serve.granian_conf:app``, is a factory.
TARGET = "serve.granian_conf:app"


def command(configured):
    """``granian``'s arguments (after the program's name) for ``configured`` (:class:`serve.settings.Settings`)."""
    return [
        "--interface", "wsgi", "--factory", "--no-ws", "--host", configured.host, "--port", str(configured.port),
        "--workers", str(configured.web_concurrency), "--blocking-threads", str(configured.gunicorn_threads),
        "--backpressure", str(configured.gunicorn_threads), "--log-level", configured.gunicorn_loglevel,
        "--workers-kill-timeout", "20", "--respawn-failed-workers", TARGET,
    ]


def app():
    """This worker's app, with its gRPC server started beside it (granian calls this in each worker)."""
    from serve import create_app

    configured = settings.process()
    _forget_workers_gone(configured.prometheus_multiproc_dir)
    application = create_app()
    if configured.grpc_port:
        from serve.grpc import server as grpc_server

        address = grpc_server.bind_address(configured.host, configured.grpc_port)
        running, _ = grpc_server.make_server(application, address, threads=configured.gunicorn_threads)
        running.start()
        atexit.register(lambda: running.stop(grpc_server.STOP_GRACE_S).wait())
    return application


def _forget_workers_gone(folder):
    """Remove the live gauges' files of worker processes that no longer run (gunicorn's ``child_exit`` does this)."""
    if not folder or not os.path.isdir(folder):
        return
    from prometheus_client import multiprocess

    for name in os.listdir(folder):
        found = re.fullmatch(r"gauge_live\w+_(\d+)\.db", name)
        if found and not _running(int(found.group(1))):
            multiprocess.mark_process_dead(int(found.group(1)), folder)


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
