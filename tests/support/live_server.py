"""A real gunicorn server on a free loopback port, started the way users start it.

Import the fixture into a test module with ``from live_server import live_server  # noqa: F401``.
"""

import os
import socket
import subprocess
import sys
import time

import pytest
import requests

STARTUP_TIMEOUT_S = 120
#: /readyz answers in a row, each on a new connection, before a server counts as ready: one answer
#: comes from one worker, and the others may still be loading their model.
READY_IN_A_ROW = 8


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir, extra_env=None, args=(), stdout=None, stderr=None, port=None, start_new_session=False):
    """Start ``python -m serve`` on a free port; return (process, base_url) once /readyz answers 200.

    ``stdout``, ``stderr``: where the server's output goes (a file; default: the tests' own). Its logs,
    ``serve.access`` included, are on stderr. ``port``: this one rather than a free one (a replica
    restarted where it was). ``start_new_session``: gunicorn's master and workers in a process group
    of their own, which ``os.killpg`` ends at once.
    """
    port = port or free_port()
    # No gRPC unless a test asks for it (--grpc-port): servers of parallel tests would share port 8500.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_PORT": "0", **(extra_env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "serve", "--model-dir", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *args],
        env=env,
        stdout=stdout,
        stderr=stderr,
        start_new_session=start_new_session,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with code {process.returncode} before it was ready")
        try:
            if all(requests.get(f"{url}/readyz", timeout=10, headers={"Connection": "close"}).status_code == 200
                   for _ in range(READY_IN_A_ROW)):
                return process, url
        except (requests.ConnectionError, requests.Timeout):
            pass  # not listening yet, or still loading the model
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"server not ready within {STARTUP_TIMEOUT_S} s")


def stop_server(process):
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def live_server(model_base):
    """Base URL of a gunicorn server (in-process backend) serving ``model_base``."""
    process, url = start_server(model_base)
    yield url
    stop_server(process)


def access_messages(text):
    """The lines of gunicorn's access log ``text`` as its access-log format wrote them, whatever SERVE_LOG_FORMAT
    wrapped them in (a JSON line carries the line as its ``message``)."""
    import json

    messages = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                line = json.loads(line).get("message", line)
            except ValueError:
                pass
        messages.append(line)
    return messages
