"""Where one request's time goes, layer by layer, under load: TF Serving JSON, 1 image, at c=1 and c=32.

Typical usage::

    python -m bench.serving.layers                                 # the cached synthetic seed_cnn
    python -m bench.serving.layers --architecture airbench_muon    # the main job's default model

The server is this project's, started as ``python -m serve`` starts it (gunicorn, its configuration, 2
workers x 16 threads, LiteRT), but on :func:`create_app`: the same app with timers around its layers, each
worker adding up its own and writing the sums when it exits. ``wrk`` posts the same body throughout. Per
request, the mean of:

* **HTTP server and client**: wrk's mean latency less the WSGI app's time (gunicorn's accept, parse and
  write, the thread hand-off, the loopback, wrk itself);
* **Flask and the hooks**: the WSGI app less the view (routing, the exchange's hooks: request id, keys,
  limits, metrics, the access line, security headers);
* **body to tensors**: the JSON body read into NumPy (``bodies.request_json``) and the codec's decode;
* **core**: :meth:`InferenceService.infer` less the backend (checks, tensor reading, admission's hold);
* **queue**: the backend's call less the model's (waiting for a batch and for the model);
* **model**: the model call that carried the request (a batch's whole time counts for each of its requests);
* **answer encoding**: the codec's encode and Flask's ``jsonify``.

The timers cost a few hundred nanoseconds each, under 1% of the lightest request.
"""

import argparse
import atexit
import collections
import json
import os
import sys
import tempfile
import threading
import time

from bench import harness, record
from bench.peers import load
from bench.peers.model import ensure_model, request_images

LAYERS = ("HTTP server and client", "Flask and the hooks", "body to tensors", "core", "queue", "model", "answer encoding")
CELLS = (("1 image, c=1", 1, 1), ("1 image, c=32", 2, 32))
ENV_OUT = "BENCH_LAYERS_DIR"


# -- in each worker ----------------------------------------------------------------------------
class _Sums:
    def __init__(self):
        self.seconds = collections.Counter()
        self.counts = collections.Counter()
        self.lock = threading.Lock()

    def add(self, name, seconds, count=1):
        with self.lock:
            self.seconds[name] += seconds
            self.counts[name] += count


SUMS = _Sums()


def _timed(name, fn):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SUMS.add(name, time.perf_counter() - start)

    return timed


def create_app():
    """serve's app with timers around its layers; the sums go to ``$BENCH_LAYERS_DIR/PID.json`` at exit."""
    from serve import create_app as serve_app
    from serve.backends import batcher
    from serve.core import service
    from serve.http import bodies
    from serve.protocols import tfserving_rest

    app = serve_app()
    app.wsgi_app = _timed("wsgi", app.wsgi_app)
    app.view_functions["tfserving.predict"] = _timed("view", app.view_functions["tfserving.predict"])
    bodies.request_json = _timed("body", bodies.request_json)
    tfserving_rest.decode = _timed("decode", tfserving_rest.decode)
    tfserving_rest.encode = _timed("encode", tfserving_rest.encode)
    tfserving_rest.jsonify = _timed("jsonify", tfserving_rest.jsonify)
    service.InferenceService.infer = _timed("core", service.InferenceService.infer)
    backend = app.extensions["serve.service"].backend
    backend.infer = _timed("backend", backend.infer)

    # The model's time, counted once for each request its call carried.
    original_run_locked = batcher.Batcher._run_locked

    def run_locked(self, batch, size):
        start = time.perf_counter()
        try:
            return original_run_locked(self, batch, size)
        finally:
            SUMS.add("model", (time.perf_counter() - start) * len(batch), len(batch))

    batcher.Batcher._run_locked = run_locked
    original_init = batcher.Batcher.__init__

    def init(self, fn, *args, **kwargs):  # an idle model is run inline, in the request's own thread
        def inline_or_batched(images):
            start = time.perf_counter()
            try:
                return fn(images)
            finally:
                if threading.current_thread().name != "batcher":
                    SUMS.add("model", time.perf_counter() - start)

        original_init(self, inline_or_batched, *args, **kwargs)

    batcher.Batcher.__init__ = init
    folder = os.environ.get(ENV_OUT)
    if folder:
        atexit.register(_write, folder)
    return app


def _write(folder):
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
        json.dump({"seconds": dict(SUMS.seconds), "counts": dict(SUMS.counts)}, f)


# -- the benchmark -----------------------------------------------------------------------------
def table_of(sums, wrk):
    """Per-request means (µs) of each layer from the workers' ``sums`` and wrk's result."""
    n = sums["counts"].get("wsgi", 0)
    if not n:
        raise RuntimeError("no request reached the app")
    s = {k: v / n * 1e6 for k, v in sums["seconds"].items()}
    model = s.get("model", 0.0)
    rows = {
        "HTTP server and client": wrk["mean_us"] - s["wsgi"],
        "Flask and the hooks": s["wsgi"] - s["view"],
        "body to tensors": s.get("body", 0.0) + s.get("decode", 0.0),
        "core": s["core"] - s["backend"],
        "queue": max(0.0, s["backend"] - model),
        "model": model,
        "answer encoding": s.get("encode", 0.0) + s.get("jsonify", 0.0),
    }
    rows["total (wrk's mean latency)"] = wrk["mean_us"]
    return rows, n


def merge(folder):
    seconds, counts = collections.Counter(), collections.Counter()
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            part = json.load(f)
        seconds.update(part["seconds"])
        counts.update(part["counts"])
    return {"seconds": seconds, "counts": counts}


def run_cell(model_dir, body_path, threads, connections, seconds, warmup, logdir):
    port = harness.free_port()
    with tempfile.TemporaryDirectory(prefix="serving-layers-") as out:
        env = dict(MODEL_DIR=model_dir, HOST="127.0.0.1", PORT=str(port), GRPC_PORT="0", MALLOC_ARENA_MAX="2",
                   TF_CPP_MIN_LOG_LEVEL="2")
        argv = [sys.executable, "-m", "gunicorn", "-c", "python:serve.gunicorn_conf", f"{__spec__.name}:create_app()"]
        server = harness.Server(argv, env, os.path.join(logdir, "serving_layers.log"))
        try:
            url = f"http://127.0.0.1:{port}/v1/models/cifar10:predict"
            with open(body_path, "rb") as f:
                server.wait_ready(url, f.read(), load.JSON)
            if warmup:
                harness.run_wrk(url, body_path, load.JSON, threads, connections, warmup)
            # Only the measured run counts: the warm-up's sums are in workers that are restarted below.
            server.stop()
            env[ENV_OUT] = out
            server = harness.Server(argv, env, os.path.join(logdir, "serving_layers.log"))
            with open(body_path, "rb") as f:
                server.wait_ready(url, f.read(), load.JSON)
            wrk = harness.run_wrk(url, body_path, load.JSON, threads, connections, seconds)
        finally:
            server.stop()
        sums = merge(out)
    # The readiness poll's requests are in the sums too: a few against wrk's thousands.
    wrk["mean_us"] = wrk["mean_ms"] * 1000
    rows, n = table_of(sums, wrk)
    return rows, n, wrk


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="a models/NAME/ root of an export (default: a cached synthetic model)")
    parser.add_argument("--architecture", default="seed_cnn", help="the cached model's architecture (default seed_cnn)")
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    args = parser.parse_args(argv)
    model_dir = args.model_dir or ensure_model(architecture=args.architecture)
    results = {}
    with tempfile.TemporaryDirectory(prefix="serving-layers-") as tmp:
        bodies = load.write_bodies(tmp, request_images(1), [])
        path, _ = bodies[("json", 1)]
        logdir = os.path.join(tmp, "logs")
        os.makedirs(logdir)
        for label, threads, connections in CELLS:
            rows, n, wrk = run_cell(model_dir, path, threads, connections, args.duration, args.warmup, logdir)
            results[label] = {"layers_us": rows, "requests_in_app": n, "wrk": wrk}
            print(f"{label}: {wrk['requests_per_s']:,.0f} req/s, p50 {wrk['p50_ms']:.2f} ms", flush=True)
    lines = ["| layer | " + " | ".join(label for label, _, _ in CELLS) + " |", "|---|" + "---:|" * len(CELLS)]
    for layer in (*LAYERS, "total (wrk's mean latency)"):
        lines.append(f"| {layer} | " + " | ".join(f"{results[label]['layers_us'][layer]:,.0f} µs" for label, _, _ in CELLS) + " |")
    table = "\n".join(lines)
    print(f"model {model_dir}; {args.duration} s a cell")
    print(table)
    record.write(args.json, {"model_dir": model_dir, "duration_s": args.duration, "cells": results}, __spec__.name, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
