"""bench/serving/soak.py's server and faults: the server under test, Redis, the fault schedule, memory from /proc."""

import os
import shlex
import socket
import statistics
import subprocess
import time

from bench import harness


def start_server(model_dir, port, env_extra, logdir):
    """``python -m serve`` on ``port``, its error log in ``logdir``, once every worker answers ``/readyz``: ``(server, url, error log)``."""
    errlog = os.path.join(logdir, "error.log")
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "GUNICORN_CMD_ARGS": f"--error-logfile {shlex.quote(errlog)}", **env_extra}
    server = harness.Server(harness.serve_argv(model_dir, port), env, os.path.join(logdir, "stderr.log"))
    url = f"http://127.0.0.1:{port}"
    server.wait_ready(f"{url}/readyz", timeout_s=180, answers=8)
    return server, url, errlog


def start_redis(logdir):
    """``redis-server`` on a free loopback port, no persistence; ``(process, port)``."""
    port = harness.free_port()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no"], stdout=open(os.path.join(logdir, "redis.log"), "wb"),
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process, port
        except OSError:
            time.sleep(0.1)
    raise SystemExit("error: redis-server did not start")


def run_faults(seconds, started, models, servers, redis, logdir, events, target, standby_url):
    """The fault schedule, at fractions of the timed run; each step noted in ``events`` with its time."""
    import shutil
    import signal

    def at(fraction):
        time.sleep(max(0.0, started + fraction * seconds - time.monotonic()))

    def note(what):
        events.append((round(time.monotonic() - started, 1), what))

    newest = max(int(n) for n in os.listdir(models) if n.isdigit())
    at(0.10)
    shutil.copytree(os.path.join(models, str(newest)), os.path.join(models, ".incoming"))
    os.rename(os.path.join(models, ".incoming"), os.path.join(models, str(newest + 1)))
    note(f"published version {newest + 1}")
    at(0.25)
    manifest = os.path.join("assets.extra", "manifest.json")
    shutil.copytree(os.path.join(models, str(newest)), os.path.join(models, str(newest + 2)),
                    ignore=shutil.ignore_patterns("manifest.json"))
    note(f"copied version {newest + 2} by hand, without its manifest")
    at(0.35)
    shutil.copy(os.path.join(models, str(newest), manifest), os.path.join(models, str(newest + 2), manifest))
    note(f"version {newest + 2}'s manifest arrived")
    at(0.45)
    process, port = redis
    process.terminate()
    process.wait(30)
    note("Redis stopped")
    at(0.55)
    redis[0] = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no"], stdout=open(os.path.join(logdir, "redis2.log"), "wb"),
                                stderr=subprocess.STDOUT)
    note("Redis restarted")
    at(0.65)
    first = servers[0]
    workers = harness.children(first.pid)
    if workers:
        os.kill(workers[0], signal.SIGKILL)
        note(f"worker {workers[0]} killed with SIGKILL")
    at(0.80)
    target.url = standby_url
    first.send_signal(signal.SIGTERM)
    note("first server sent SIGTERM; the load moves to the standby")


def sample_memory(pid, stop, samples, started):
    while not stop.wait(1.0):
        workers = harness.children(pid)
        samples.append((time.monotonic() - started, harness.rss_mb(pid), [harness.rss_mb(w) for w in workers], workers))


def window_mean(samples, start, end):
    values = [master + sum(workers) for t, master, workers, _ in samples if start <= t < end]
    return statistics.fmean(values) if values else float("nan")
