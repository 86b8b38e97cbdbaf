"""Soak: many concurrent clients posting good and bad uploads to the server under gunicorn.

Typical usage::

    python -m bench.serving.soak --model-dir models/cifar10 --data ../shared/data/cifar10-jpeg.zip

Starts ``python -m serve`` on 127.0.0.1 (the deployment's gunicorn layout unless ``--serve-env``
says otherwise) and, after ``--warmup`` seconds of the same load, runs ``--clients`` clients for
``--seconds``. Each client posts one request after another, drawn from a fixed mix: good CIFAR
test JPEGs (one or eight per multipart request, JSON b64, TF Serving's row format, the web form,
a good image beside a bad one, a 5,000-character file name) and bad input (text, truncated JPEG,
TIFF, a decompression bomb, bad base64, JSON 100,000 levels deep, malformed multipart, a body
over the upload limit). Every answer is checked against what that request must get.

With ``--api-key`` every request carries that key, and the server is meant to run with keys and
rate limits on (``--serve-env SERVE_API_KEYS=... --serve-env SERVE_RATE_LIMIT_API=...``): then a
429 is an expected answer to any request, and a good image it refused counts as refused, not lost.

Pass/fail, as the issue asks:

* no 5xx (and no request left without an answer: timeouts and dropped connections count);
* every good image answered (each good image's slot holds a label), or refused with a 429;
* resident memory of the server (gunicorn master and workers, from /proc) grows at most 10%
  from the mean of the first 10 s to the mean of the last 10 s of the timed run.

Also reported: the workers are the ones the server started with (none crashed or was
restarted), and the lines of the server's error log that are errors. Bounded: a fixed number of
clients, a per-request timeout, the run stops at ``--seconds``, and the script gives up on a
client that has not finished 60 s after that. Linux only (/proc).

With ``--faults`` the run is a fault soak (issue 42): the server serves a copy of the model
directory with keys and a rate limit in a Redis the script starts (``redis-server`` on a loopback
port), a second server stands by on another port, and during the run, in order: a new version is
published (export's way: complete, then renamed in), a version is copied in by hand without its
manifest and the manifest follows 10% of the run later, Redis is stopped and restarted, a worker is
killed with SIGKILL, and the first server gets SIGTERM while loaded (a rolling restart: the load
moves to the second server, as a load balancer moves it; a request refused at the connection is
sent once more, to wherever the load now goes). Reported apart: 503s that carry ``Retry-After``
(load shed on purpose, not errors), the model versions that answered, and the memory of the first
server up to its SIGTERM.
"""

import collections
import json
import os
import random
import tempfile
import threading
import time

import requests

from bench import harness, record
from bench.serving.soak_cases import PREDICT, make_cases, read_jpegs
from bench.serving.soak_faults import run_faults, sample_memory, start_redis, start_server, window_mean

REQUEST_TIMEOUT_S = 30
GRACE_S = 60
GROWTH_LIMIT = 0.10
WINDOW_S = 10


# -- the load ----------------------------------------------------------------------------------
class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_case = collections.defaultdict(collections.Counter)
        self.wrong = collections.Counter()
        self.examples = {}
        self.good_sent = self.good_answered = self.good_refused = 0
        self.requests = 0

    def record(self, case, status, ok, answered_good, note=None, refused=0):
        with self.lock:
            self.requests += 1
            self.by_case[case.name][status] += 1
            self.good_sent += case.good
            self.good_answered += answered_good
            self.good_refused += refused
            if not ok:
                self.wrong[case.name] += 1
                self.examples.setdefault(case.name, note)


class Target:
    """Where the load goes now (a load balancer's choice): the first server, then the standby."""

    def __init__(self, url):
        self.url = url

    def __call__(self):
        return self.url


def client(url, cases, weights, seed, stop_at, tally, counting, api_key=None, versions=None):
    rng = random.Random(seed)
    target = url if callable(url) else (lambda: url)

    def new_session():
        session = requests.Session()
        if api_key:
            session.headers["X-API-Key"] = api_key
        return session

    session = new_session()
    while time.monotonic() < stop_at:
        case = rng.choices(cases, weights)[0]
        method, path, kwargs = case.send(rng)
        try:
            response = _send(session, method, target, path, kwargs, retry=callable(url))
        except requests.RequestException as e:
            if counting.is_set():
                tally.record(case, f"no answer ({type(e).__name__})", False, 0, str(e)[:200])
            session = new_session()
            continue
        status = response.status_code
        if status == 503 and response.headers.get("Retry-After"):  # shed on purpose: counted apart
            if counting.is_set():
                tally.record(case, "503 Retry-After", True, 0, refused=case.good)
            continue
        if versions is not None and status == 200 and path == PREDICT:
            try:
                versions[response.json()["model"]["version"]] += 1
            except (ValueError, KeyError, TypeError):
                pass
        if status == 429 and api_key:  # over the rate limit: an expected answer to anything
            if counting.is_set():
                tally.record(case, status, True, 0, refused=case.good)
            continue
        ok, answered = status == case.status, 0
        if ok and case.good:
            if case.check is None:  # the form: a page with a label, or the verdict "none of the classes"
                ok = any(f'data-testid="{kind}"' in response.text for kind in ("label", "verdict", "not-sure"))
            else:
                try:
                    ok = case.check(response.json())
                except ValueError:
                    ok = False
            answered = case.good if ok else 0
        if counting.is_set():
            tally.record(case, status, ok, answered, None if ok else response.text[:200])


def _send(session, method, target, path, kwargs, retry):
    """One request; with ``retry``, a connection refused or reset is sent once more, to wherever the load goes now."""
    try:
        return session.request(method, target() + path, timeout=REQUEST_TIMEOUT_S, **kwargs)
    except requests.ConnectionError:
        if not retry:
            raise
        return session.request(method, target() + path, timeout=REQUEST_TIMEOUT_S, **kwargs)


def main(argv=None):
    p = harness.arguments(__doc__)
    p.add_argument("--clients", type=int, default=64, help="concurrent clients, each one request at a time")
    p.add_argument("--seconds", type=float, default=60, help="length of the timed run")
    p.add_argument("--warmup", type=float, default=5, help="seconds of the same load before the timed run (not counted)")
    p.add_argument("--faults", action="store_true",
                   help="a fault soak: new versions, Redis stopped and restarted, a worker killed, a rolling restart")
    p.add_argument("--api-key", help="send this key with every request (a server with SERVE_API_KEYS); 429s are then expected")
    p.add_argument("--images", type=int, default=200, help="distinct good test images in the mix")
    p.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    args = p.parse_args(argv)
    if not os.path.isdir(args.model_dir):
        raise SystemExit(f"error: no model directory {args.model_dir} (export one, or pass --model-dir)")
    env_extra = dict(item.split("=", 1) for item in args.serve_env)
    limit_mb = float(env_extra.get("SERVE_MAX_UPLOAD_MB") or os.environ.get("SERVE_MAX_UPLOAD_MB") or 16)

    jpegs = read_jpegs(args.data, args.images)
    cases = make_cases(jpegs, limit_mb, int(env_extra.get("SERVE_MAX_IMAGES") or 256))
    weights = [c.weight for c in cases]
    logdir = tempfile.mkdtemp(prefix="soak-")
    model_dir, redis, standby, events, versions = os.path.abspath(args.model_dir), None, None, [], collections.Counter()
    if args.faults:
        import shutil

        model_dir = os.path.join(logdir, "models", os.path.basename(model_dir.rstrip("/")))
        shutil.copytree(os.path.abspath(args.model_dir), model_dir)
        redis = list(start_redis(logdir))
        args.api_key = args.api_key or "soak-key"
        env_extra = {"SERVE_API_KEYS": args.api_key, "SERVE_RATE_LIMIT_API": "1000000/minute",
                     "SERVE_RATE_LIMIT_STORE": f"redis://127.0.0.1:{redis[1]}/0", "MODEL_POLL_S": "2", **env_extra}
        os.makedirs(os.path.join(logdir, "standby"))
        standby, standby_url, _ = start_server(model_dir, harness.free_port(), env_extra, os.path.join(logdir, "standby"))
    server, url, errlog = start_server(model_dir, harness.free_port(), env_extra, logdir)
    process = server.proc
    target = Target(url) if args.faults else url
    try:
        workers_at_start = harness.children(process.pid)
        tally, counting, stop_memory = Tally(), threading.Event(), threading.Event()
        begin = time.monotonic()
        stop_at = begin + args.warmup + args.seconds
        threads = [
            threading.Thread(target=client, args=(target, cases, weights, args.seed * 1000 + i, stop_at, tally, counting,
                                                  args.api_key, versions), daemon=True)
            for i in range(args.clients)
        ]
        for thread in threads:
            thread.start()
        time.sleep(args.warmup)
        counting.set()
        started = time.monotonic()
        samples = []
        memory = threading.Thread(target=sample_memory, args=(process.pid, stop_memory, samples, started), daemon=True)
        memory.start()
        if args.faults:
            faults = threading.Thread(target=run_faults, args=(args.seconds, started, model_dir, [process], redis, logdir,
                                                               events, target, standby_url), daemon=True)
            faults.start()
        for thread in threads:
            thread.join(max(0.0, stop_at + GRACE_S - time.monotonic()))
        elapsed = time.monotonic() - started
        stuck = sum(thread.is_alive() for thread in threads)
        stop_memory.set()
        memory.join(5)
        workers_at_end = harness.children(process.pid)
        alive = requests.get(f"{target() if args.faults else url}/readyz", timeout=30).status_code  # open: no key needed
    finally:
        for running in (server, standby):
            if running is not None:
                running.stop()
        if redis:
            redis[0].terminate()
            redis[0].wait(30)

    with open(errlog) as f:
        error_lines = [line.rstrip() for line in f if any(
            word in line for word in ("[ERROR]", "[CRITICAL]", "Traceback", '"level": "ERROR"', '"level": "CRITICAL"'))]
    first = window_mean(samples, 0, WINDOW_S)
    end = 0.8 * args.seconds if args.faults else args.seconds  # the first server's SIGTERM
    last = window_mean(samples, end - WINDOW_S, end)
    growth = last / first - 1
    statuses = collections.Counter()
    for counter in tally.by_case.values():
        statuses.update(counter)
    server_errors = sum(n for s, n in statuses.items() if isinstance(s, int) and s >= 500)
    unanswered = sum(n for s, n in statuses.items() if str(s).startswith("no answer"))
    shed = statuses.get("503 Retry-After", 0)
    results = {
        "clients": args.clients, "seconds": round(elapsed, 1), "warmup_s": args.warmup, "requests": tally.requests,
        "requests_per_s": round(tally.requests / elapsed, 1), "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "server_errors_5xx": server_errors, "unanswered": unanswered, "wrong_answers": dict(tally.wrong),
        "wrong_examples": tally.examples, "good_images_sent": tally.good_sent, "good_images_answered": tally.good_answered,
        "good_images_refused_429": tally.good_refused,
        "rss_first_10s_mb": round(first, 1), "rss_last_10s_mb": round(last, 1), "rss_growth": round(growth, 4),
        "rss_per_process_last_mb": [round(samples[-1][1], 1)] + [round(w, 1) for w in samples[-1][2]] if samples else [],
        "workers_unchanged": workers_at_start == workers_at_end, "clients_not_finished": stuck,
        "ready_after": alive, "server_error_log_lines": error_lines[:20], "server_env": env_extra,
        "by_case": {name: {str(k): v for k, v in counter.items()} for name, counter in tally.by_case.items()},
        "rss_series_mb": [[round(t, 1), round(master + sum(workers), 1)] for t, master, workers, _ in samples],
        "shed_503_retry_after": shed, "versions_answered": {str(k): v for k, v in sorted(versions.items())},
        "faults": events,
    }
    checks = {
        "no 5xx, none unanswered": server_errors == 0 and unanswered == 0 and stuck == 0,
        "every good image answered (or refused with a 429)": tally.good_answered + tally.good_refused == tally.good_sent
        and tally.good_answered > 0,
        "every answer as expected": not tally.wrong,
        f"RSS growth <= {GROWTH_LIMIT:.0%}": growth <= GROWTH_LIMIT,
        "workers unchanged, server ready after": workers_at_start == workers_at_end and alive == 200,
        "no errors in the server log": not error_lines,
    }
    if args.faults:  # a worker is killed and the first server stopped on purpose: the standby answers after
        del checks["workers unchanged, server ready after"], checks["no errors in the server log"]
        checks["the standby ready after"] = alive == 200
    results["checks"] = checks
    print(f"soak: {args.clients} clients, {elapsed:.1f} s (after {args.warmup:g} s warm-up), {tally.requests} requests "
          f"({tally.requests / elapsed:.1f}/s); server env {env_extra or 'default'}")
    print("| request | sent | answers |")
    print("|---|---:|---|")
    for case in cases:
        counter = tally.by_case.get(case.name, {})
        print(f"| {case.name} | {sum(counter.values())} | {', '.join(f'{k}: {v}' for k, v in sorted(counter.items(), key=str))} |")
    print(f"good images: {tally.good_answered} answered, {tally.good_refused} refused with 429, of {tally.good_sent} sent; 5xx: {server_errors}; "
          f"unanswered: {unanswered}; wrong: {dict(tally.wrong) or 'none'}")
    print(f"resident memory (master + workers): first {WINDOW_S} s {first:.0f} MB, last {WINDOW_S} s {last:.0f} MB, "
          f"growth {growth:+.2%}; per process at the end: {results['rss_per_process_last_mb']} MB")
    if args.faults:
        print(f"503 with Retry-After (shed): {shed}; versions answered: {dict(sorted(versions.items()))}")
        for when, what in events:
            print(f"  at {when:6.1f} s: {what}")
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
    if tally.examples:
        print("examples of wrong answers:", json.dumps(tally.examples, indent=1)[:2000])
    record.write(args.json, results, __spec__.name, argv)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
