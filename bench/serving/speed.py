"""Serving runtimes side by side in one run: agreement, in-process speed, HTTP through gunicorn, memory.

Typical usage::

    python -m bench.serving.speed --model-dir models/cifar10 --data ../shared/data/cifar10-jpeg.zip \\
        --json bench/records/serving-speed-NAME.json

Sections:

* agreement: every test image of ``--data`` (10,000 for CIFAR-10) through the SavedModel and each
  LiteRT model of the newest version: top-1 agreement with the SavedModel, accuracy, largest
  probability difference.
* in-process: each runtime of ``serve/backends/runtimes.py`` called on uint8 pixels at batch 1, 32,
  64, one call after another, with every core (LiteRT: ``num_threads`` = cores).
* HTTP: ``python -m serve`` under gunicorn with ``SERVE_RUNTIME`` set to each runtime in turn
  (``--servers litert,litert@2`` picks them, ``@N`` setting ``SERVE_RUNTIME_THREADS``), and the floor,
  ``bench/serving/hello_app.py`` (a fixed JSON answer) under the same gunicorn configuration, driven
  by ``wrk`` posting a prepared multipart body of CIFAR JPEGs: one image at concurrency 1 and 32,
  and 64 images per request on two connections. After its rows, each server's workers' resident
  memory is read from /proc.

In-process and HTTP rows are measured in ``--repeats`` rounds, each round going through every runtime
(and the floor) once, and the medians compared, so a change in background load during the run shows
up in the per-round numbers instead of favouring one side. Only one server runs at a time; wrk runs
on at most two threads. Percentiles are exact (wrk's latency record, or every timed call in-process).
"""

import io
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from PIL import Image

from bench import harness, record

RUNTIMES = ("savedmodel", "litert", "litert-int8")
RAW_BATCHES = (1, 32, 64)
FLOOR = "hello-world floor"
# (label, images per request, wrk threads, wrk connections)
HTTP_RUNS = (
    ("1 image, c=1", 1, 1, 1),
    ("1 image, c=32", 1, 2, 32),
    ("64 images, c=2", 64, 1, 2),
)
TARGETS = {
    "int8_agreement": 0.99,  # int8 top-1 agreement with the SavedModel, all test images
    "int8_accuracy_loss": 0.003,  # at most, accuracy points as a fraction
    "batched_vs_savedmodel": 2.5,  # HTTP 64-image requests, litert / savedmodel, images per second
    "c32_vs_floor": 0.4,  # HTTP single images at c=32, litert / hello-world floor
    "p50_c1_ms": 1.0,  # HTTP p50 at c=1, litert, at most
    "worker_rss_mb": 200,  # resident memory per gunicorn worker, litert, at most
}


def decode(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32), Image.Resampling.BILINEAR), np.uint8)


# -- agreement -----------------------------------------------------------------------------------
def probabilities(model, images, batch=256):
    from contract import OUTPUT_PROBABILITIES

    return np.concatenate([np.asarray(model.pixels(images[i:i + batch])[OUTPUT_PROBABILITIES], np.float32)
                           for i in range(0, len(images), batch)])


def agreement(got, reference, labels):
    return {
        "images": len(got),
        "agreement": float((got.argmax(1) == reference.argmax(1)).mean()),
        "accuracy": float((got.argmax(1) == labels).mean()),
        "accuracy_loss": float((reference.argmax(1) == labels).mean() - (got.argmax(1) == labels).mean()),
        "max_abs_diff": float(np.abs(got - reference).max()),
    }


def agreement_rows(models, images, labels):
    """``{runtime: measures}``, each against the SavedModel's answers."""
    reference = probabilities(models["savedmodel"], images)
    return {name: agreement(probabilities(model, images), reference, labels) for name, model in models.items()}


# -- in-process ----------------------------------------------------------------------------------
def time_calls(fn, batch, seconds, warmup=5):
    for _ in range(warmup):
        fn()
    latencies = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        t = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - t)
    ms = np.asarray(latencies) * 1000.0
    return {"images_per_s": len(latencies) * batch / (time.perf_counter() - started),
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def raw_round(models, images, seconds):
    return {f"{runtime}, batch {batch}": time_calls(lambda x=images[:batch]: model.pixels(x), batch, seconds)
            for runtime, model in models.items() for batch in RAW_BATCHES}


# -- HTTP ----------------------------------------------------------------------------------------
def serve_round(name, model_dir, bodies, args, logdir):
    """Start ``name``'s server (a runtime of serve/, or the floor), run its wrk rows, read its memory, stop it."""
    port = harness.free_port()
    env = dict(kv.split("=", 1) for kv in args.serve_env)
    if name == FLOOR:
        argv, runs = harness.floor_argv(), HTTP_RUNS[:2]  # no model: no 64-image row
        env.update(HOST="127.0.0.1", PORT=str(port))
        env.setdefault("MALLOC_ARENA_MAX", "2")  # as python -m serve sets it for the model's servers
    else:
        argv, runs = harness.serve_argv(model_dir, port), HTTP_RUNS
        runtime, _, threads = name.partition("@")  # "litert@2": the litert runtime on 2 threads
        env["SERVE_RUNTIME"] = runtime
        if threads:
            env["SERVE_RUNTIME_THREADS"] = threads
    server = harness.Server(argv, env, os.path.join(logdir, f"{name.replace(' ', '-')}.log"))
    url = f"http://127.0.0.1:{port}/api/v1/predict"
    try:
        if name == FLOOR:
            with open(bodies[1], "rb") as f:
                server.wait_ready(url, f.read(), harness.MULTIPART, timeout_s=60)
        else:
            server.wait_ready(f"http://127.0.0.1:{port}/readyz", timeout_s=180)
        rows = {}
        for label, images, threads, connections in runs:
            if args.warmup:
                harness.run_wrk(url, bodies[images], harness.MULTIPART, threads, connections, args.warmup)
            row = harness.run_wrk(url, bodies[images], harness.MULTIPART, threads, connections, args.duration)
            row["images_per_s"] = row["requests_per_s"] * images
            rows[f"{name}, {label}"] = row
        return rows, max(server.worker_rss_mb(), default=None)
    finally:
        server.stop()


def checks(found, http, rss):
    """``[(target, measured, wanted, met)]`` of what this run measured."""
    out = []

    def check(name, value, op, target):
        out.append((name, value, f"{op} {target:g}", value >= target if op == ">=" else value <= target))

    if "litert" in found:
        check("LiteRT float top-1 agreement, all test images", found["litert"]["agreement"], ">=", 1.0)
    if "litert-int8" in found:
        check("int8 top-1 agreement, all test images", found["litert-int8"]["agreement"], ">=", TARGETS["int8_agreement"])
        check("int8 accuracy loss, points", found["litert-int8"]["accuracy_loss"] * 100, "<=", TARGETS["int8_accuracy_loss"] * 100)
    if "litert, 64 images, c=2" in http and "savedmodel, 64 images, c=2" in http:
        check("HTTP 64 images/request: litert / savedmodel", http["litert, 64 images, c=2"]["images_per_s"]
              / http["savedmodel, 64 images, c=2"]["images_per_s"], ">=", TARGETS["batched_vs_savedmodel"])
    for runtime in ("litert", "litert-int8"):
        if f"{runtime}, 1 image, c=32" in http and f"{FLOOR}, 1 image, c=32" in http:
            check(f"HTTP 1 image c=32: {runtime} / floor", http[f"{runtime}, 1 image, c=32"]["requests_per_s"]
                  / http[f"{FLOOR}, 1 image, c=32"]["requests_per_s"], ">=", TARGETS["c32_vs_floor"])
    if "litert, 1 image, c=1" in http:
        check("HTTP 1 image c=1: litert p50, ms", http["litert, 1 image, c=1"]["p50_ms"], "<=", TARGETS["p50_c1_ms"])
    if rss.get("litert"):
        check("worker RSS, litert, MB", rss["litert"], "<=", TARGETS["worker_rss_mb"])
    return out


def table(rows, columns):
    """A markdown table of ``rows`` (``{label: {figure: value}}``) in ``columns``."""
    lines = ["| row | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [f"| {label} | " + " | ".join(f"{r[c]:,.2f}" for c in columns) + " |" for label, r in rows.items()]
    return "\n".join(lines)


def main(argv=None):
    from serve.backends import published, runtimes

    p = harness.arguments(__doc__)
    p.add_argument("--agreement-images", type=int, default=0, help="test images for the agreement table (0: all)")
    p.add_argument("--duration", type=int, default=5, help="seconds per timed wrk run")
    p.add_argument("--repeats", type=int, default=2, help="rounds over every runtime (medians reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed wrk seconds before each timed run (0: none)")
    p.add_argument("--raw-seconds", type=float, default=2.0, help="seconds per in-process row")
    p.add_argument("--skip-http", action="store_true", help="only the in-process sections")
    p.add_argument("--servers", help="HTTP servers to run, comma-separated RUNTIME or RUNTIME@THREADS (SERVE_RUNTIME_THREADS), "
                                     "e.g. litert,litert@2 (default: every runtime the version has)")
    args = p.parse_args(argv)
    if not args.skip_http and not shutil.which("wrk"):
        sys.exit("wrk not found: apt-get install -y wrk")

    model_dir = os.path.abspath(args.model_dir)
    available = published.versions(model_dir)
    if not available:
        sys.exit(f"no versions under {model_dir}")
    version_dir = os.path.join(model_dir, str(available[-1]))
    served = published.manifest(version_dir)
    if served is None:
        sys.exit(f"no readable manifest in {version_dir}/assets.extra (export writes one)")
    test = harness.read_test_images(args.data, args.agreement_images or None)
    images = np.stack([decode(data) for _, _, data in test])
    labels = np.asarray([served.class_names.index(folder) for folder, _, _ in test])
    logdir = tempfile.mkdtemp(prefix="bench-serving-")
    bodies = {}
    for n in (1, 64):
        bodies[n] = os.path.join(logdir, f"body-{n}.bin")
        with open(bodies[n], "wb") as f:
            f.write(harness.multipart([(name, data) for _, name, data in test[:n]]))

    cores = len(os.sched_getaffinity(0))
    models = {rt: runtimes.load(rt, version_dir, cores) for rt in RUNTIMES
              if os.path.isfile(os.path.join(version_dir, runtimes.MODEL_FILES[rt]))}
    found = agreement_rows(models, images, labels)
    raw_rounds, http_rounds, rss = [], [], {}
    names = [] if args.skip_http else [*(args.servers.split(",") if args.servers else models), FLOOR]
    for _ in range(args.repeats):
        raw_rounds.append(raw_round(models, images, args.raw_seconds))
        round_rows = {}
        for name in names:
            rows, largest = serve_round(name, model_dir, bodies, args, logdir)
            round_rows.update(rows)
            rss[name] = max(largest or 0, rss.get(name) or 0) or None
        http_rounds.append(round_rows)
    del models
    raw = harness.median_rows(raw_rounds)
    http = harness.median_rows(http_rounds) if http_rounds and http_rounds[0] else {}
    shutil.rmtree(logdir, ignore_errors=True)

    print(f"### Agreement with the SavedModel ({len(images)} test images)\n")
    print(table(found, ("agreement", "accuracy", "accuracy_loss", "max_abs_diff")))
    print(f"\n### In-process ({args.repeats} rounds, medians; LiteRT on {cores} threads)\n")
    print(table(raw, ("images_per_s", "p50_ms", "p99_ms")))
    if http:
        print(f"\n### HTTP through gunicorn ({args.repeats} rounds, medians; wrk {args.duration} s a row after {args.warmup} s)\n")
        print(table(http, ("images_per_s", "requests_per_s", "p50_ms", "p99_ms")))
        print("\nworker RSS, MB: " + ", ".join(f"{name} {mb:.0f}" for name, mb in rss.items() if mb))
    measured = checks(found, http, rss)
    print("\n### Targets\n")
    for name, value, wanted, met in measured:
        print(f"{name}: {value:.4g} (wanted {wanted}): {'met' if met else 'MISSED'}")
    record.write(args.json, {"model": version_dir, "data": os.path.basename(args.data), "serve_env": args.serve_env,
                             "agreement": found, "in_process": raw, "in_process_rounds": raw_rounds, "http": http,
                             "http_rounds": http_rounds, "worker_rss_mb": rss,
                             "targets": [{"target": n, "measured": v, "wanted": w, "met": m} for n, v, w, m in measured]},
                 __spec__.name, argv)


if __name__ == "__main__":
    main()
