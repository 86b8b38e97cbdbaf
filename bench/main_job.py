"""The main job's time as a user waits for it: ``scripts/main.sh`` from its start to a server that answers
``/readyz``, each stage timed, with ``vmstat`` beside it so that the figure can be judged.

Typical usage::

    python bench/main_job.py --data ../shared/data/cifar10-png.zip --venv .venv \\
        --json bench/records/main-job-airbench_muon-png.json

The job runs as a user runs it, with ``INSTALL=0``: the install is not part of the time (the target
excludes it), so ``--venv`` names an environment already made from ``requirements/all.txt``. Its run
and models go to a scratch directory (``--work``), so every run trains from scratch. Stages are
timed from the lines ``scripts/main.sh`` prints as they come: start to ``== export``, to ``== serve``,
to the first ``/readyz`` that answers 200 (polled every half second). The server is then stopped.

The record: the command, the CPU kind (``lscpu``'s model name and whether it has AVX-512 BF16 and
AMX), the commit, each stage's seconds, the trainer's time budget choice and its test accuracy
(from the run's manifest), and ``vmstat``'s CPU shares (user, system, idle, stolen) over each stage.
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from emit import emit  # noqa: E402  (bench/ is not a package)

STAGES = ("train", "export", "serve")


def cpu_kind():
    """``(lscpu's model name, the kind)``: "AVX-512 BF16 + AMX", "AVX-512", "AVX2" or "other"."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return None, "unknown"
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in lines)}
    flags = set(fields.get("Flags", "").split())
    if {"avx512_bf16", "amx_bf16"} <= flags:
        kind = "AVX-512 BF16 + AMX"
    elif "avx512f" in flags:
        kind = "AVX-512"
    elif "avx2" in flags:
        kind = "AVX2"
    else:
        kind = "other"
    return fields.get("Model name"), kind


def commit():
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


class Vmstat:
    """``vmstat -n 5`` in the background: (monotonic time, r, us, sy, id, st) every 5 s."""

    def __init__(self, every=5):
        self.rows = []
        self.process = subprocess.Popen(["vmstat", "-n", str(every)], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        header = None
        for line in self.process.stdout:
            parts = line.split()
            if "us" in parts:
                header = parts
                continue
            if header and len(parts) == len(header) and parts[0].isdigit():
                row = dict(zip(header, map(int, parts)))
                self.rows.append((time.monotonic(), *(row[k] for k in ("r", "us", "sy", "id", "st"))))

    def stop(self):
        self.process.terminate()
        self.process.wait()

    def summary(self, start, end):
        """Median, mean and largest of r (runnable processes) and the shares us, sy, id, st between ``start`` and ``end``."""
        rows = [r for r in self.rows if start < r[0] <= end]
        if not rows:
            return None
        out = {"samples": len(rows)}
        for i, name in enumerate(("r", "us", "sy", "id", "st"), start=1):
            values = [r[i] for r in rows]
            out[name] = {"median": statistics.median(values), "max": max(values), "mean": round(statistics.mean(values), 1)}
        return out


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
                   help="more of main.sh's variables (TIME_BUDGET=480, EPOCHS=10, TRAIN_ARGS=...), repeatable")
    p.add_argument("--json", help="also write the record here")
    args = p.parse_args(argv)

    work = args.work or tempfile.mkdtemp(prefix="main-job-")
    extra = dict(item.split("=", 1) for item in args.env)
    env = {**os.environ, "INSTALL": "0", "VENV": os.path.abspath(args.venv), "CIFAR_DATA": os.path.abspath(args.data),
           "RUN_DIR": os.path.join(work, "run"), "MODELS_DIR": os.path.join(work, "models"), "PORT": str(args.port),
           **extra}
    model_name, kind = cpu_kind()
    vmstat = Vmstat()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        marks, lines = run_job(env, args.port, args.timeout, log=lambda line: print(line, flush=True))
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
    record = {
        "command": "python bench/main_job.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpu_kind": kind, "model_name": model_name, "cpus": os.cpu_count()},
        "commit": commit(),
        "date": started,
        "job_env": {k: v for k, v in extra.items()},
        "seconds": {name: round(marks[b] - marks[a], 1) for name, (a, b) in spans.items()},
        "vmstat": {name: vmstat.summary(marks[a], marks[b]) for name, (a, b) in spans.items()},
        "training": {"budget": manifest["training"]["budget"], "epochs": manifest["training"]["recipe"]["epochs"],
                     "wall_time_s": manifest["training"]["wall_time_s"]},
        "test_accuracy": manifest["metrics"]["test_accuracy"],
        "test_images": manifest["metrics"]["test_images"],
        "heldout_accuracy": (published.get("confidence") or {}).get("held_out", {}).get("accuracy"),
        "log": lines,
    }
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    emit(record, args.json)


if __name__ == "__main__":
    main()
