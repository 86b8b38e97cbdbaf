"""What the benchmarks share: servers started and stopped, wrk driven, memory read from /proc, calls timed.

Every server runs in its own process group from the repository root, so :meth:`Server.stop` ends its
workers too. ``wrk`` posts one prepared body (``bench/wrk/post_body.lua`` prints wrk's exact latency
percentiles and error counters as one ``WRK_JSON`` line).
"""

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRK_SCRIPT = os.path.join(ROOT, "bench", "wrk", "post_body.lua")
BOUNDARY = "benchharness7d1f0c"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"
FLOOR_APP = "bench.serving.hello_app:create_app()"


def arguments(doc):
    """A parser for a serving benchmark: its description from ``doc``; ``--model-dir``, ``--data``, ``--serve-env``, ``--json``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--model-dir", default="models/cifar10", help="model directory holding version folders N/")
    p.add_argument("--data", default="../shared/data/cifar10-jpeg.zip", help="CIFAR-10 JPEG zip: test/<class>/ images")
    p.add_argument("--serve-env", action="append", default=[], metavar="KEY=VALUE", help="extra environment for the server")
    p.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    return p


# -- processes -----------------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    """The child processes of ``pid`` (a gunicorn master's workers), sorted."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return sorted(int(c) for c in f.read().split())
    except OSError:
        return []


def rss_mb(pid):
    """Resident memory of one process, MB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def process_rss_mb(pid):
    """Resident memory, MB, of ``pid`` and of each of its descendants (workers, arbiters, queues), one by one."""
    sizes, stack = [], [pid]
    while stack:
        p = stack.pop()
        sizes.append(rss_mb(p))
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return sizes


def serve_argv(model_dir, port, grpc_port=0):
    """``python -m serve`` on 127.0.0.1:``port`` with its defaults (gRPC off unless ``grpc_port``)."""
    return [sys.executable, "-m", "serve", "--model-dir", model_dir, "--host", "127.0.0.1", "--port", str(port),
            "--grpc-port", str(grpc_port)]


def floor_argv():
    """The hello-world floor (``bench/serving/hello_app.py``) under serve's own gunicorn configuration; HOST and PORT from the environment."""
    return [sys.executable, "-m", "gunicorn", "-c", "python:serve.gunicorn_conf", FLOOR_APP]


class Server:
    """A server in its own process group, started from the repository root with its output in ``log_path``."""

    def __init__(self, argv, env=None, log_path=os.devnull):
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, url, body=None, content_type=None, timeout_s=240, answers=1):
        """Poll ``url`` (a POST of ``body`` when given) until ``answers`` calls in a row answer 200.

        ``answers`` above 1 waits for every worker: each answers ``/readyz`` only once its model is loaded.
        A server that exits or is not ready in ``timeout_s`` is stopped, and RuntimeError says why.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the server exited with {self.proc.returncode} (log: {self.log.name})")
            try:
                if all(post(url, body, content_type, timeout=10)[0] == 200 for _ in range(answers)):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{url} not ready after {timeout_s} s (log: {self.log.name})")

    def worker_rss_mb(self):
        """Resident memory of each worker (the master's children), MB."""
        return [rss_mb(pid) for pid in children(self.proc.pid)]

    def _group_alive(self):
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def stop(self, grace_s=30):
        """SIGTERM to the group, then SIGKILL to what is left after ``grace_s`` (a worker that outlived its master included)."""
        if self._group_alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (self.proc.poll() is None or self._group_alive()):
            time.sleep(0.2)
        if self._group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def post(url, data=None, content_type=None, timeout=30):
    """``(status, body)`` of a POST of ``data`` to ``url``, or of a GET when ``data`` is None."""
    request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type} if content_type else {})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.status, answer.read()


# -- load --------------------------------------------------------------------------------------
def parse_wrk(output):
    """The numbers of bench/wrk/post_body.lua's ``WRK_JSON`` line in ``output``."""
    match = re.search(r"^WRK_JSON (.*)$", output, re.M)
    if not match:
        raise RuntimeError(f"no WRK_JSON line in wrk's output:\n{output}")
    r = json.loads(match.group(1))
    seconds = r["duration_us"] / 1e6
    return {
        "requests": r["requests"],
        "requests_per_s": r["requests"] / seconds,
        "p50_ms": r["p50_us"] / 1000.0,
        "p99_ms": r["p99_us"] / 1000.0,
        "mean_ms": r["mean_us"] / 1000.0,
        "non_2xx": r["status_errors"],  # wrk counts answers with a status above 399
        "socket_errors": r["connect_errors"] + r["read_errors"] + r["write_errors"],
        "timeouts": r["timeouts"],
    }


def run_wrk(url, body_path, content_type, threads, connections, seconds, timeout_s=10):
    """wrk posting the body in ``body_path`` to ``url`` for ``seconds``: :func:`parse_wrk`'s numbers."""
    env = dict(os.environ, WRK_BODY=body_path, WRK_CONTENT_TYPE=content_type)
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", f"{timeout_s}s", "--latency", "-s",
            WRK_SCRIPT, url]
    return parse_wrk(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout)


def multipart(files, content_type="image/jpeg"):
    """A multipart/form-data body (:data:`MULTIPART`) with every ``(file name, bytes)`` under the field ``file``."""
    parts = [f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
             f"Content-Type: {content_type}\r\n\r\n".encode() + data + b"\r\n" for name, data in files]
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def read_test_images(zip_path, count=None):
    """``[(class folder, file name, bytes)]`` of the archive's ``test/`` images, classes interleaved."""
    with zipfile.ZipFile(zip_path) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith("test/") and n.lower().endswith((".jpg", ".jpeg", ".png")))
        by_class = {}
        for name in names:
            by_class.setdefault(name.split("/")[1], []).append(name)
        picked, total = [], count or len(names)
        while len(picked) < total and any(by_class.values()):
            for files in by_class.values():
                if files and len(picked) < total:
                    picked.append(files.pop(0))
        return [(n.split("/")[1], os.path.basename(n), archive.read(n)) for n in picked]


# -- timing ------------------------------------------------------------------------------------
def median_ms(fn, calls, warmup=100):
    """The median of ``calls`` timed calls of ``fn`` after ``warmup`` untimed ones, milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000.0


def median_rows(rounds):
    """Per row of ``rounds`` (each ``{row: {figure: value}}``), the median of each figure over the rounds."""
    return {key: {k: statistics.median(r[key][k] for r in rounds) for k in rounds[0][key]} for key in rounds[0]}
