"""bench/serving.py's HTTP section: one server at a time under gunicorn (a runtime of serve/, or the
hello-world floor), driven by wrk posting a prepared multipart body; its workers' memory from /proc."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRK_SCRIPT = os.path.join(ROOT, "bench", "wrk", "post_body.lua")
PREDICT_PATH = "/api/v1/predict"
BOUNDARY = "benchserving7d1f0c"
FLOOR = "hello-world floor"
# (label, images per request, wrk threads, wrk connections)
HTTP_RUNS = (
    ("1 image, c=1", 1, 1, 1),
    ("1 image, c=32", 1, 2, 32),
    ("64 images, c=2", 64, 1, 2),
)
FLOOR_RUNS = HTTP_RUNS[:2]


def multipart(files):
    """A multipart/form-data body with every file under the field ``file``."""
    parts = []
    for filename, data in files:
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            f"Content-Type: image/jpeg\r\n\r\n".encode() + data + b"\r\n"
        )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(url, body, content_type, timeout_s, proc):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type} if body else {})
            with urllib.request.urlopen(request, timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


class Server:
    """A server process in its own process group, stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, argv, env, log_path):
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def worker_rss_mb(self):
        """Resident memory of each gunicorn worker (the master's children), MB."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                children = [int(pid) for pid in f.read().split()]
        except OSError:
            return []
        sizes = []
        for pid in children:
            try:
                with open(f"/proc/{pid}/status") as f:
                    kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
                sizes.append(kb / 1024)
            except (OSError, StopIteration):
                pass
        return sizes

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def run_wrk(url, body_path, images, threads, connections, seconds):
    env = dict(os.environ, WRK_BODY=body_path, WRK_CONTENT_TYPE=f"multipart/form-data; boundary={BOUNDARY}")
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "--latency", "-s", WRK_SCRIPT, url]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    match = re.search(r"^WRK_JSON (.*)$", out, re.M)
    if not match:
        raise RuntimeError(f"no WRK_JSON line in wrk's output:\n{out}")
    r = json.loads(match.group(1))
    errors = r["connect_errors"] + r["read_errors"] + r["write_errors"] + r["status_errors"] + r["timeouts"]
    return {
        "images_per_s": r["requests"] * images / (r["duration_us"] / 1e6),
        "requests_per_s": r["requests"] / (r["duration_us"] / 1e6),
        "p50_ms": r["p50_us"] / 1000.0,
        "p99_ms": r["p99_us"] / 1000.0,
        "errors": errors,
    }


def serve_round(name, model_dir, bodies, args, logdir):
    """Start ``name``'s server (a runtime of serve/, or the floor), run its wrk rows, read its memory, stop it."""
    port = free_port()
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.serve_env)
    if name == FLOOR:
        argv = [sys.executable, "-m", "gunicorn", "-c", "python:serve.gunicorn_conf", "bench.hello_app:create_app()"]
        env.update(HOST="127.0.0.1", PORT=str(port))
        env.setdefault("MALLOC_ARENA_MAX", "2")  # as python -m serve sets it for the model's servers
        runs = FLOOR_RUNS
    else:
        argv = [sys.executable, "-m", "serve", "--model-dir", model_dir, "--host", "127.0.0.1", "--port", str(port)]
        runtime, _, threads = name.partition("@")  # "litert@2": the litert runtime on 2 threads
        env["SERVE_RUNTIME"] = runtime
        if threads:
            env["SERVE_RUNTIME_THREADS"] = threads
        runs = HTTP_RUNS
    server = Server(argv, env, os.path.join(logdir, f"{name.replace(' ', '-')}.log"))
    url = f"http://127.0.0.1:{port}{PREDICT_PATH}"
    try:
        if name == FLOOR:
            with open(bodies[1], "rb") as f:
                wait_until(url, f.read(), f"multipart/form-data; boundary={BOUNDARY}", 60, server.proc)
        else:
            wait_until(f"http://127.0.0.1:{port}/readyz", None, None, 180, server.proc)
        rows = {}
        for label, images, threads, connections in runs:
            if args.warmup:
                run_wrk(url, bodies[images], images, threads, connections, args.warmup)
            rows[label] = run_wrk(url, bodies[images], images, threads, connections, args.duration)
        return rows, server.worker_rss_mb()
    finally:
        server.stop()
