"""Serving throughput and latency, side by side in one run: the raw SavedModel signature, the
local backend through its interface, HTTP through gunicorn (serve/), and a naive Flask baseline.

Typical usage::

    python bench/serving.py --model-dir models/cifar10 --data ../shared/data/cifar10-jpeg.zip

Rows:

* raw: ``serving_default`` called in-process on uint8 pixels at batch 1, 32 and 64, one call
  after another;
* backend: ``serve.backends.LocalBackend.predict`` (its micro-batcher included) at batch 1 and
  64 from one thread, and batch 1 from 32 threads at once;
* HTTP: ``python -m serve`` under gunicorn, driven by ``wrk`` (Debian's ``wrk``) posting a
  prepared multipart body (bench/wrk/post_body.lua): one image at concurrency 1, 8 and 32, and
  64 images per request;
* naive: bench/naive_app.py (Keras ``model.predict`` per request, gunicorn's default sync worker).

Every server is started here on a free loopback port and stopped at the end; only one runs at a
time. The raw rows and the serve/ HTTP rows are measured in interleaved rounds (raw, HTTP, raw,
HTTP, ...) and the medians are compared, so a change in background load during the run shows up
in the per-round numbers instead of skewing one side. The 64-image target uses two connections
(one request decodes while the other's batch runs); one connection is shown too. wrk is pinned to
at most two threads so that the load generator leaves the server's cores alone. Percentiles are
exact (wrk's latency record via the Lua ``done`` hook, or every timed call in-process).
"""

import argparse
import io
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from contract import INPUT_PIXELS, SIGNATURE_PIXELS  # noqa: E402
from serve import signatures  # noqa: E402

WRK_SCRIPT = os.path.join(ROOT, "bench", "wrk", "post_body.lua")
PREDICT_PATH = "/api/v1/predict"
BOUNDARY = "benchserving7d1f0c"
# (label, images per request, wrk threads, wrk connections)
HTTP_RUNS = (
    ("1 image, c=1", 1, 1, 1),
    ("1 image, c=8", 1, 2, 8),
    ("1 image, c=32", 1, 2, 32),
    ("64 images, c=1", 64, 1, 1),
    ("64 images, c=2", 64, 1, 2),
)
NAIVE_RUNS = (
    ("1 image, c=1", 1, 1, 1),
    ("1 image, c=32", 1, 2, 32),
)
TARGETS = {
    "batched": 0.8,  # HTTP 64-image requests / raw batch 64, images per second
    "c32_vs_raw": 0.35,  # HTTP single images at c=32 / raw batch 32
    "c32_vs_naive": 10.0,  # HTTP single images at c=32 / naive at c=32
    "p50_c1": 2.0,  # HTTP p50 at c=1 / raw batch-1 p50 (at most)
}


# -- inputs ----------------------------------------------------------------------------------
def read_jpegs(zip_path, count):
    """``count`` JPEGs from the archive's test/ split, a few from each class, as bytes."""
    with zipfile.ZipFile(zip_path) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith("test/") and n.lower().endswith(".jpg"))
        by_class = {}
        for name in names:
            by_class.setdefault(name.split("/")[1], []).append(name)
        picked = []
        while len(picked) < count:
            for files in by_class.values():
                if files and len(picked) < count:
                    picked.append(files.pop(0))
        return [(os.path.basename(n), archive.read(n)) for n in picked]


def multipart(files):
    """A multipart/form-data body with every file under the field ``file``."""
    parts = []
    for filename, data in files:
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            f"Content-Type: image/jpeg\r\n\r\n".encode() + data + b"\r\n"
        )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def pixels(files, batch):
    decoded = [np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for _, data in files]
    return np.stack([decoded[i % len(decoded)] for i in range(batch)]).astype(np.uint8)


# -- in-process measurements ---------------------------------------------------------------------
def summarise(latencies_s, images, elapsed_s):
    ms = np.asarray(latencies_s) * 1000.0
    return {"images_per_s": images / elapsed_s, "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def time_calls(fn, batch, seconds, warmup=5):
    for _ in range(warmup):
        fn()
    latencies = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        t = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - started
    return summarise(latencies, len(latencies) * batch, elapsed)


def time_threads(fn, threads, seconds):
    """``fn`` called in a loop from ``threads`` threads at once (one image each)."""
    for _ in range(5):
        fn()
    latencies = [[] for _ in range(threads)]
    stop = time.perf_counter() + seconds
    barrier = threading.Barrier(threads + 1)

    def loop(mine):
        barrier.wait()
        while time.perf_counter() < stop:
            t = time.perf_counter()
            fn()
            mine.append(time.perf_counter() - t)

    workers = [threading.Thread(target=loop, args=(latencies[i],)) for i in range(threads)]
    for w in workers:
        w.start()
    started = time.perf_counter()
    barrier.wait()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    flat = [x for mine in latencies for x in mine]
    return summarise(flat, len(flat), elapsed)


def raw_caller(version_dir, files):
    """``{batch: call}``: ``serving_default`` on real pixels at batch 1, 32 and 64."""
    import tensorflow as tf

    fn = tf.saved_model.load(version_dir).signatures[SIGNATURE_PIXELS]
    calls = {}
    for batch in (1, 32, 64):
        x = tf.constant(pixels(files, batch))
        calls[batch] = lambda x=x: fn(**{INPUT_PIXELS: x})["probabilities"].numpy()
    return calls


def raw_rows(calls, seconds):
    return {batch: time_calls(call, batch, seconds) for batch, call in calls.items()}


def backend_rows(model_dir, files, seconds):
    from serve.backends import LocalBackend

    backend = LocalBackend(model_dir, "cifar10")
    backend.wait_loaded()
    one, sixty_four = pixels(files, 1), pixels(files, 64)
    rows = {
        "batch 1": time_calls(lambda: backend.predict(one), 1, seconds),
        "batch 64": time_calls(lambda: backend.predict(sixty_four), 64, seconds),
        "batch 1 x 32 threads": time_threads(lambda: backend.predict(one), 32, seconds),
    }
    backend.close()
    return rows


# -- servers and wrk --------------------------------------------------------------------------
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
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

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
        "p50_ms": r["p50_us"] / 1000.0,
        "p99_ms": r["p99_us"] / 1000.0,
        "errors": errors,
        "requests": r["requests"],
    }


def http_rows(port, bodies, runs, seconds, warmup_s):
    url = f"http://127.0.0.1:{port}{PREDICT_PATH}"
    rows = {}
    for label, images, threads, connections in runs:
        if warmup_s:
            run_wrk(url, bodies[images], images, threads, connections, warmup_s)
        rows[label] = run_wrk(url, bodies[images], images, threads, connections, seconds)
    return rows


def median_rows(rounds):
    """Per row, the median of each number over the rounds."""
    return {
        key: {name: statistics.median(r[key][name] for r in rounds) for name in rounds[0][key]} for key in rounds[0]
    }


def serve_and_raw_rows(model_dir, bodies, raw_calls, args, logdir):
    """Interleaved rounds: the raw signature, then every HTTP row, ``args.repeats`` times."""
    port = free_port()
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.serve_env)
    server = Server(
        [sys.executable, "-m", "serve", "--model-dir", model_dir, "--host", "127.0.0.1", "--port", str(port)],
        env,
        os.path.join(logdir, "serve.log"),
    )
    raw_rounds, http_rounds = [], []
    try:
        wait_until(f"http://127.0.0.1:{port}/readyz", None, None, 180, server.proc)
        for round_ in range(args.repeats):
            raw_rounds.append(raw_rows(raw_calls, args.raw_seconds))
            http_rounds.append(http_rows(port, bodies, HTTP_RUNS, args.duration, args.warmup if round_ == 0 else 0))
    finally:
        server.stop()
    return raw_rounds, http_rounds


def naive_rows(version_dir, bodies, args, logdir):
    port = free_port()
    env = dict(os.environ, NAIVE_MODEL_DIR=version_dir)
    argv = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--timeout", "120", "bench.naive_app:create_app()"]
    server = Server(argv, env, os.path.join(logdir, "naive.log"))
    try:
        with open(bodies[1], "rb") as f:
            wait_until(f"http://127.0.0.1:{port}{PREDICT_PATH}", f.read(), f"multipart/form-data; boundary={BOUNDARY}", 180, server.proc)
        return http_rows(port, bodies, NAIVE_RUNS, args.duration, args.warmup)
    finally:
        server.stop()


# -- report -------------------------------------------------------------------------------------
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def background_load():
    """Other processes busy on this machine, e.g. training jobs (their command lines)."""
    try:
        out = subprocess.run(["pgrep", "-af", "m train"], capture_output=True, text=True).stdout
    except OSError:
        return []
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.strip() and "pgrep" not in line]


def table(rows):
    lines = ["| path | case | images/s | p50 ms | p99 ms | img/s per round |", "|---|---|---:|---:|---:|---|"]
    for path, case, r, rounds in rows:
        note = f" ({r['errors']:.0f} errors)" if r.get("errors") else ""
        lines.append(f"| {path} | {case} | {r['images_per_s']:.0f}{note} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {rounds} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default="models/cifar10", help="model directory holding version folders N/")
    p.add_argument("--data", default="../shared/data/cifar10-jpeg.zip", help="CIFAR-10 JPEG zip; test/ images become the payloads")
    p.add_argument("--duration", type=int, default=5, help="seconds per timed wrk run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds of raw and HTTP rows (medians reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed wrk seconds before each timed run (0: none)")
    p.add_argument("--raw-seconds", type=float, default=2.0, help="seconds per in-process row")
    p.add_argument("--serve-env", action="append", default=[], metavar="KEY=VALUE", help="extra environment for the serve/ server")
    p.add_argument("--skip-naive", action="store_true", help="leave out the naive baseline (quicker while tuning)")
    args = p.parse_args(argv)
    if not shutil.which("wrk"):
        sys.exit("wrk not found: apt-get install -y wrk")

    model_dir = os.path.abspath(args.model_dir)
    available = signatures.versions(model_dir)
    if not available:
        sys.exit(f"no SavedModel versions under {model_dir}")
    version_dir = os.path.join(model_dir, str(available[-1]))
    files = read_jpegs(args.data, 64)
    logdir = tempfile.mkdtemp(prefix="bench-serving-")
    bodies = {}
    for n in (1, 64):
        bodies[n] = os.path.join(logdir, f"body-{n}.bin")
        with open(bodies[n], "wb") as f:
            f.write(multipart(files[:n]))

    import tensorflow as tf

    background = background_load()
    raw_calls = raw_caller(version_dir, files)
    backend = backend_rows(model_dir, files, args.raw_seconds)
    raw_rounds, http_rounds = serve_and_raw_rows(model_dir, bodies, raw_calls, args, logdir)
    naive = {} if args.skip_naive else naive_rows(version_dir, bodies, args, logdir)
    raw, http = median_rows(raw_rounds), median_rows(http_rounds)

    def spread(rounds, key):
        return " / ".join(f"{r[key]['images_per_s']:.0f}" for r in rounds)

    rows = [("raw signature", f"batch {b}", raw[b], spread(raw_rounds, b)) for b in raw]
    rows += [("local backend", case, r, "") for case, r in backend.items()]
    rows += [("HTTP serve/", case, r, spread(http_rounds, case)) for case, r in http.items()]
    rows += [("HTTP naive", case, r, "") for case, r in naive.items()]

    c32 = http["1 image, c=32"]["images_per_s"]
    ratios = [
        ("HTTP 64 images/request c=2 / raw batch 64, img/s", http["64 images, c=2"]["images_per_s"] / raw[64]["images_per_s"], ">=", TARGETS["batched"]),
        ("HTTP 1 image c=32 / raw batch 32, img/s", c32 / raw[32]["images_per_s"], ">=", TARGETS["c32_vs_raw"]),
    ]
    if naive:
        ratios.append(("HTTP 1 image c=32 / naive c=32, img/s", c32 / naive["1 image, c=32"]["images_per_s"], ">=", TARGETS["c32_vs_naive"]))
    ratios.append(("HTTP p50 at c=1 / raw batch-1 p50", http["1 image, c=1"]["p50_ms"] / raw[1]["p50_ms"], "<=", TARGETS["p50_c1"]))
    # Not a target: one client sending batches strictly one after another, so nothing overlaps.
    info = [("HTTP 64 images/request c=1 / raw batch 64, img/s", http["64 images, c=1"]["images_per_s"] / raw[64]["images_per_s"])]

    print(f"command: python bench/serving.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, TensorFlow {tf.__version__}, model {version_dir}")
    print(f"{args.repeats} interleaved rounds (raw signature, then every serve/ HTTP row); medians shown, "
          f"per-round img/s in the last column")
    print(f"wrk: {args.duration} s per row ({args.warmup} s warmup in the first round); in-process rows {args.raw_seconds:g} s each")
    if args.serve_env:
        print(f"serve/ environment: {' '.join(args.serve_env)}")
    print("background load during the run: " + ("; ".join(background) if background else "none found (pgrep -af 'm train')"))
    print()
    print(table(rows))
    print()
    print("| ratio | measured | target | |")
    print("|---|---:|---:|---|")
    for name, value, op, target in ratios:
        ok = value >= target if op == ">=" else value <= target
        print(f"| {name} | {value:.2f}x | {op} {target:g}x | {'PASS' if ok else 'FAIL'} |")
    for name, value in info:
        print(f"| {name} | {value:.2f}x | (no target) | |")
    shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    main()
