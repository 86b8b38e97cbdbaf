"""The main job's time as a user waits for it: ``scripts/main.sh`` from its start to a server that answers
``/readyz``, each stage timed, with ``vmstat`` beside it so that the figure can be judged.

Typical usage::

    python -m bench.training.main_job --data ../shared/data/cifar10-png.zip --venv .venv \\
        --load "quiet: nothing else ran" --json bench/records/training-main-job-airbench_muon-default.json

The job runs as a user runs it, with ``INSTALL=0``: the install is not part of the time (the target
excludes it), so ``--venv`` names an environment already made from ``requirements/all.txt``. Its run
and models go to a scratch directory (``--work``), so every run trains from scratch. Stages are
timed from the lines ``scripts/main.sh`` prints as they come: start to ``== export``, to ``== serve``,
to the first ``/readyz`` that answers 200 (polled every half second). The server is then stopped.

The record (``bench.record``'s, with ``--load``'s words and ``vmstat``'s median of runnable processes
over the whole job as the machine's load): each stage's seconds, the trainer's time budget choice and
its test accuracy (from the run's manifest), the held-out accuracy export measured, and ``vmstat``'s
runnable processes and CPU shares (user, system, idle, stolen) over each stage.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

from bench import record
from bench.training.vmstat import Vmstat, load

ROOT = record.ROOT
STAGES = ("train", "export", "serve")


def ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def run_job(env, port, timeout, log):
    """Run scripts/main.sh; returns ``({mark: monotonic time}, its lines)``: start, train, export, serve, ready."""
    marks = {"start": time.monotonic()}
    lines = []
    process = subprocess.Popen([os.path.join(ROOT, "scripts", "main.sh")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def read():
        for line in process.stdout:
            now = time.monotonic()
            lines.append(f"{now - marks['start']:8.1f} {line.rstrip()}")
            log(lines[-1])
            for stage in STAGES:
                if line.startswith(f"== {stage}:") and stage not in marks:
                    marks[stage] = now

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = marks["start"] + timeout
        while time.monotonic() < deadline and process.poll() is None:
            if "serve" in marks and ready(port):
                marks["ready"] = time.monotonic()
                break
            time.sleep(0.5)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # the job's own process group: main.sh exec'd the server
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        reader.join(timeout=5)
    if "ready" not in marks:
        raise SystemExit(f"the job did not reach a ready server (exit {process.returncode}); its last lines:\n"
                         + "\n".join(lines[-20:]))
    return marks, lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="CIFAR_DATA for the job, e.g. ../shared/data/cifar10-png.zip")
    p.add_argument("--venv", default=os.path.join(ROOT, ".venv"), help="an environment made from requirements/all.txt")
    p.add_argument("--work", help="scratch directory for the run and the models (default: a new temporary one, removed)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the job is stopped as failed")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="more of main.sh's variables (TIME_BUDGET=0, EPOCHS=10, TRAIN_ARGS=...), repeatable")
    p.add_argument("--load", help="how shared the machine was, in words, e.g. \"shared: other work ran beside it\" "
                   "(default: the 1-minute load average as it started); vmstat's median r is added")
    p.add_argument("--json", help="write the record here (bench/records/training-main-job-NAME.json)")
    args = p.parse_args(argv)

    work = args.work or tempfile.mkdtemp(prefix="main-job-")
    extra = dict(item.split("=", 1) for item in args.env)
    env = {**os.environ, "INSTALL": "0", "VENV": os.path.abspath(args.venv), "CIFAR_DATA": os.path.abspath(args.data),
           "RUN_DIR": os.path.join(work, "run"), "MODELS_DIR": os.path.join(work, "models"), "PORT": str(args.port),
           **extra}
    machine = record.machine()
    words = args.load or f"1-minute load average {machine['load']} as it started"
    vmstat = Vmstat()
    try:
        marks, _ = run_job(env, args.port, args.timeout, log=lambda line: print(line, flush=True))
    finally:
        vmstat.stop()
    with open(os.path.join(work, "run", "manifest.json")) as f:
        manifest = json.load(f)
    versions = os.path.join(work, "models", env.get("MODEL_NAME", "cifar10"))
    latest = max(os.listdir(versions), key=int)
    with open(os.path.join(versions, latest, "assets.extra", "manifest.json")) as f:
        published = json.load(f)
    spans = {"train": ("start", "export"), "export": ("export", "serve"), "serve_until_ready": ("serve", "ready"),
             "whole": ("start", "ready")}
    shares = {name: vmstat.summary(marks[a], marks[b]) for name, (a, b) in spans.items()}
    figures = {
        "job_env": extra,
        "seconds": {name: round(marks[b] - marks[a], 1) for name, (a, b) in spans.items()},
        "vmstat": shares,
        "training": {"budget": manifest["training"]["budget"], "epochs": manifest["training"]["recipe"]["epochs"],
                     "wall_time_s": manifest["training"]["wall_time_s"]},
        "test_accuracy": manifest["metrics"]["test_accuracy"],
        "test_images": manifest["metrics"]["test_images"],
        "heldout_accuracy": (published.get("confidence") or {}).get("held_out", {}).get("accuracy"),
    }
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    record.write(args.json, figures, __spec__.name, argv, machine={**machine, "load": load(words, shares["whole"])})


if __name__ == "__main__":
    main()
