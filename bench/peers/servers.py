"""bench/peers' servers: how each starts, which routes it answers, its pinned virtual environment.

This project and the hello-world floor run from the project's own environment (the Python that
runs the benchmark); each peer runs from ``bench/peers/.venvs/NAME/``, made on first use from
``bench/peers/requirements-NAME.txt`` (exact pins) and remade when that file changes.
"""

import hashlib
import os
import subprocess
import sys

from bench import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VENVS = os.path.join(HERE, ".venvs")

THIS = "this project"
THIS_GRANIAN = "this project, granian"
FLOOR = "hello-world floor"
FLOOR_GRANIAN = "hello-world floor, granian"
PEERS = ("kserve", "bentoml", "litserve")
ORDER = (THIS, THIS_GRANIAN, *PEERS, FLOOR, FLOOR_GRANIAN)
ALIASES = {"this": THIS, "this-granian": THIS_GRANIAN, "floor": FLOOR, "hello": FLOOR, "floor-granian": FLOOR_GRANIAN}

# Per server, the route of each kind of request; a kind it does not take is absent.
ROUTES = {
    THIS: {"json": "/v1/models/cifar10:predict", "png": "/api/v1/predict", "v2": "/v2/models/cifar10/infer",
           "grpc-tfs": "grpc", "grpc-v2": "grpc"},
    "kserve": {"json": "/v1/models/cifar10:predict", "v2": "/v2/models/cifar10/infer", "grpc-v2": "grpc"},
    "bentoml": {"json": "/predict", "png": "/classify"},
    "litserve": {"json": "/predict", "png": "/predict"},
    # The floor answers a fixed JSON to any POST on /api/v1/predict after reading the body.
    FLOOR: {"json": "/api/v1/predict", "png": "/api/v1/predict"},
}
ROUTES[THIS_GRANIAN] = ROUTES[THIS]
ROUTES[FLOOR_GRANIAN] = ROUTES[FLOOR]
FLOORS = (FLOOR, FLOOR_GRANIAN)
FLOOR_CELLS = ("json-1-c1", "json-1-c32", "png-1-c1", "png-1-c32")  # no model, so no 64-image cells

VERSIONS = {"kserve": "KServe ModelServer", "bentoml": "BentoML", "litserve": "LitServe"}


def resolve(names):
    """Canonical server names, in ORDER, from a comma-separated list ("this,kserve,floor")."""
    wanted = {ALIASES.get(n.strip().lower(), n.strip().lower()) for n in names.split(",") if n.strip()}
    unknown = wanted - set(ORDER)
    if unknown:
        raise SystemExit(f"unknown servers {sorted(unknown)}; choose from this, {', '.join(PEERS)}, floor")
    return [n for n in ORDER if n in wanted]


def requirements(peer):
    return os.path.join(HERE, f"requirements-{peer}.txt")


def venv_python(peer):
    return os.path.join(VENVS, peer, "bin", "python")


def ensure_venv(peer, log=print):
    """``bench/peers/.venvs/PEER/``, installed from its requirements file unless already installed from this very file."""
    with open(requirements(peer), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(VENVS, peer, ".requirements.sha256")
    if os.path.isfile(stamp) and open(stamp).read().strip() == digest:
        return venv_python(peer)
    log(f"installing {peer}'s environment in {os.path.relpath(os.path.join(VENVS, peer), ROOT)} (first use; a minute or two)")
    if not os.path.isfile(venv_python(peer)):
        # The base interpreter of the one running (a venv of a venv would point at ours).
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", os.path.join(VENVS, peer)], check=True)
    subprocess.run([venv_python(peer), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", requirements(peer)], check=True)
    with open(stamp, "w") as f:
        f.write(digest + "\n")
    return venv_python(peer)


def installed_version(peer):
    out = subprocess.run([venv_python(peer), "-m", "pip", "show", peer], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Version:")), "?")


def command(name, model_dir, port, grpc_port):
    """(argv, extra environment) that start ``name`` on 127.0.0.1:``port``, its settings as its docs give them."""
    if name == THIS:
        # Its defaults: gunicorn, 2 workers x 16 threads, LiteRT float; its gRPC server on (on a free port).
        return harness.serve_argv(model_dir, port, grpc_port), {}
    if name == THIS_GRANIAN:  # the same, under SERVE_SERVER=granian (serve/granian_conf.py)
        argv, _ = command(THIS, model_dir, port, grpc_port)
        return argv, {"SERVE_SERVER": "granian"}
    if name == FLOOR:
        return harness.floor_argv(), {"HOST": "127.0.0.1", "PORT": str(port), "GRPC_PORT": "0", "MALLOC_ARENA_MAX": "2"}
    if name == FLOOR_GRANIAN:  # granian as serve/granian_conf.py runs it: 2 workers x 16 blocking threads
        argv = [sys.executable, "-m", "granian", "--interface", "wsgi", "--factory", "--no-ws", "--host", "127.0.0.1",
                "--port", str(port), "--workers", "2", "--blocking-threads", "16", "--backpressure", "16",
                harness.FLOOR_APP.removesuffix("()")]
        return argv, {"MALLOC_ARENA_MAX": "2"}
    python = venv_python(name)
    if name == "kserve":
        return [python, os.path.join(HERE, "kserve_server.py"), "--model-dir", model_dir, "--http_port", str(port),
                "--grpc_port", str(grpc_port), "--workers", "2"], {}
    if name == "bentoml":
        bentoml = os.path.join(os.path.dirname(python), "bentoml")
        return [bentoml, "serve", "bentoml_service:CIFAR10", "--working-dir", HERE, "--host", "127.0.0.1", "--port", str(port)], {
            "BENCH_MODEL_DIR": model_dir, "BENTOML_DO_NOT_TRACK": "True"}
    if name == "litserve":
        return [python, os.path.join(HERE, "litserve_server.py"), "--model-dir", model_dir, "--port", str(port)], {}
    raise ValueError(name)
