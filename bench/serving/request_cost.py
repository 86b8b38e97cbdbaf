"""What one request costs the server beyond its model, counted in CPU instructions (callgrind), not timed.

Typical usage::

    python -m bench.serving.request_cost                      # every route and the hello-world floor, under callgrind
    python -m bench.serving.request_cost --routes tfserving,hello --requests 500
    python -m bench.serving.request_cost --profile tfserving  # cProfile of the same requests: where they go

Each route's request (the single-image bodies of bench/peers) is sent through the app's
WSGI callable in this process, as gunicorn calls it (no socket, no HTTP parsing), with a model that
answers at once: a backend whose one call, through the local backend's own batcher, returns outputs
made beforehand, and the metrics in prometheus-client's multiprocess files, as under gunicorn. Each
route runs in its own process under ``valgrind --tool=callgrind`` with counting off; after
``--warmup`` requests the process switches counting on (callgrind's client requests, from a small C
library built with ``cc``), sends ``--requests`` more and switches it off: the total over the count
is one request's instructions, free of start-up, imports and first-call work. Instruction counts do
not move with the load of a shared machine the way timings do, so two versions of the code can be
compared on a busy one. ``hello`` is bench/serving/hello_app.py, Flask's own floor, on the same path.
"""

import argparse
import io
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from bench import harness, record

MODEL_NAME = "cifar10"
ROUTES = ("tfserving", "v2", "api", "healthz", "hello")
DEFAULT_REQUESTS = 200
DEFAULT_WARMUP = 50


def _signature_defs():
    """``serving_default`` and ``predict_images`` in TF Serving's JSON form, as an export has them."""

    def tensor(dtype, *dims):
        return {"dtype": dtype, "tensor_shape": {"dim": [{"size": str(d)} for d in dims]}}

    outputs = {
        "probabilities": tensor("DT_FLOAT", -1, 10), "class_ids": tensor("DT_INT64", -1),
        "class_names": tensor("DT_STRING", -1), "ood_score": tensor("DT_FLOAT", -1), "in_distribution": tensor("DT_BOOL", -1),
    }
    return {
        "serving_default": {"inputs": {"images": tensor("DT_UINT8", -1, 32, 32, 3)}, "outputs": outputs,
                            "method_name": "tensorflow/serving/predict"},
        "predict_images": {"inputs": {"image_bytes": tensor("DT_STRING", -1)}, "outputs": outputs,
                           "method_name": "tensorflow/serving/predict"},
    }


class Instant:
    """A local backend whose model answers at once: the real batcher, the real info, outputs made beforehand."""

    kind = "local"
    loaded = True

    def __init__(self):
        from bench.peers.model import CLASSES
        from serve.backends import signatures
        from serve.backends.batcher import Batcher
        from serve.core.model import Confidence, ModelInfo

        self._info = ModelInfo(
            name=MODEL_NAME, version=1, versions=(1,), architecture="seed_cnn", class_names=CLASSES,
            confidence=Confidence(True, 1.2, "energy", -8.0), signatures=signatures.of_json(_signature_defs()),
            runtime="litert",
        )
        probabilities = np.linspace(0.01, 0.19, 10, dtype=np.float32)[None]
        self._outputs = {
            "probabilities": probabilities, "class_ids": np.array([9]), "class_names": np.array([b"truck"], object),
            "ood_score": np.array([-12.5], np.float32), "in_distribution": np.array([True]),
        }
        self._batcher = Batcher(self._model)

    def _model(self, images):
        return {name: np.repeat(value, len(images), axis=0) for name, value in self._outputs.items()} if len(images) > 1 \
            else self._outputs

    def info(self, version=None):
        return self._info

    def infer(self, images, version=None, deadline=None):
        from serve.core.model import Prediction

        return Prediction(1, self._batcher.submit(images, deadline))

    def run(self, signature_name, inputs, version=None):
        return self._outputs

    def ready(self):
        return 1

    def close(self):
        self._batcher.close()


def requests_for(route):
    """``(app, method, path, body, content type)`` of ``route``'s single-image request."""
    from bench.peers import load
    from bench.peers.model import png, request_images

    images = request_images(1)
    if route == "hello":
        from bench.serving import hello_app

        body, content_type = load.body("json", images, [])
        return hello_app.create_app(), "POST", "/api/v1/predict", body, content_type
    from serve import create_app

    app = create_app({"MODEL_NAME": MODEL_NAME, "MODEL_DIR": tempfile.gettempdir()}, backend=Instant())
    if route == "tfserving":
        body, content_type = load.body("json", images, [])
        return app, "POST", f"/v1/models/{MODEL_NAME}:predict", body, content_type
    if route == "v2":
        body, content_type = load.body("v2", images, [])
        return app, "POST", f"/v2/models/{MODEL_NAME}/infer", body, content_type
    if route == "api":
        body, content_type = load.body("png", images, [png(image) for image in images])
        return app, "POST", "/api/v1/predict", body, content_type
    if route == "healthz":
        return app, "GET", "/healthz", b"", None
    raise ValueError(f"unknown route {route!r}; the routes are {', '.join(ROUTES)}")


def sender(route):
    """A function that sends ``route``'s request once through the app's WSGI callable and checks the answer."""
    from werkzeug.test import EnvironBuilder

    app, method, path, body, content_type = requests_for(route)
    base = EnvironBuilder(path=path, method=method, data=body or None, content_type=content_type,
                          environ_base={"REMOTE_ADDR": "127.0.0.1"}).get_environ()
    status = []

    def start_response(line, headers, exc_info=None):
        status.append(line)

    def send():
        environ = dict(base)
        environ["wsgi.input"] = io.BytesIO(body)
        answer = app(environ, start_response)
        try:
            b"".join(answer)
        finally:
            if hasattr(answer, "close"):
                answer.close()
        line = status.pop()
        if not line.startswith("200"):
            raise RuntimeError(f"{route}: {line}")

    return send


#: Switches callgrind's counting on and off from Python (its client requests; no-ops outside valgrind).
_TOGGLE_C = r"""
#include <valgrind/callgrind.h>
void count_on(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void count_off(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""


def _toggle_library(folder):
    """A small C library with ``count_on``/``count_off``, built with the system's compiler and valgrind's header."""
    source, library = os.path.join(folder, "toggle.c"), os.path.join(folder, "toggle.so")
    with open(source, "w") as f:
        f.write(_TOGGLE_C)
    done = subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", library, source], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cannot build the callgrind toggle (needs cc and valgrind's headers):\n{done.stderr}")
    return library


def run(route, requests, warmup, library):
    """Send ``warmup`` requests of ``route``, then ``requests`` more with callgrind counting (the child process)."""
    import ctypes

    toggle = ctypes.CDLL(library)
    send = sender(route)
    for _ in range(warmup):
        send()
    toggle.count_on()
    for _ in range(requests):
        send()
    toggle.count_off()


def instructions(route, requests, warmup, folder):
    """Instructions callgrind counts over ``requests`` requests of ``route``, after ``warmup`` uncounted ones."""
    out = os.path.join(folder, f"callgrind.{route}")
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
               "-m", __spec__.name, "--child", route, "--requests", str(requests), "--warmup", str(warmup),
               "--toggle", _toggle_library(folder)]
    # As under gunicorn (serve/gunicorn_conf.py): the metrics in prometheus-client's multiprocess files.
    env = dict(os.environ, PYTHONHASHSEED="0", PROMETHEUS_MULTIPROC_DIR=tempfile.mkdtemp(dir=folder, prefix="prometheus-"))
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=harness.ROOT)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind of {route} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return int(found.group(1))


def profile(route, requests, warmup, top):
    """cProfile of ``requests`` requests of ``route`` after ``warmup``: the functions with the most cumulative time."""
    import cProfile
    import pstats

    send = sender(route)
    for _ in range(warmup):
        send()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(requests):
        send()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--routes", default=",".join(ROUTES), help=f"comma-separated, of {', '.join(ROUTES)} (default: all)")
    p.add_argument("--requests", type=int, default=DEFAULT_REQUESTS,
                   help=f"requests counted (or profiled) a route, after the warm-up (default: {DEFAULT_REQUESTS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help=f"requests sent before either count (default: {DEFAULT_WARMUP})")
    p.add_argument("--keep", help="a folder to keep the callgrind output files in (for callgrind_annotate)")
    p.add_argument("--profile", metavar="ROUTE", help="instead of counting, print a cProfile of ROUTE's requests")
    p.add_argument("--top", type=int, default=40, help="rows of --profile's listing (default: 40)")
    p.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    p.add_argument("--child", metavar="ROUTE", help=argparse.SUPPRESS)
    p.add_argument("--toggle", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import logging

    # The access log's lines are written as in the server, to a sink: their cost counts, not a terminal's.
    if args.child or args.profile:
        sys.stderr = open(os.devnull, "w")
    logging.raiseExceptions = False
    if args.child:
        run(args.child, args.requests, args.warmup, args.toggle)
        return 0
    if args.profile:
        profile(args.profile, args.requests, args.warmup, args.top)
        return 0
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    for route in routes:
        if route not in ROUTES:
            p.error(f"unknown route {route!r}; the routes are {', '.join(ROUTES)}")
    folder = args.keep or tempfile.mkdtemp(prefix="request-cost-")
    os.makedirs(folder, exist_ok=True)
    print(f"{'route':<10} {'instructions a request':>24}")
    counted = {}
    for route in routes:
        counted[route] = instructions(route, args.requests, args.warmup, folder) / args.requests
        print(f"{route:<10} {counted[route]:>24,.0f}", flush=True)
    record.write(args.json, {"instructions_a_request": counted}, __spec__.name, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
