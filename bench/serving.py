"""Serving runtimes side by side in one run: agreement, in-process speed, HTTP through gunicorn, memory.

Typical usage::

    python bench/serving.py --model-dir models/cifar10 --data ../shared/data/cifar10-jpeg.zip
    python bench/serving.py --model-dir models/cifar10 --run runs/seed_cnn   # + int8 calibration variants

Sections:

* agreement: every test image of ``--data`` (10,000 for CIFAR-10) through the SavedModel and
  each LiteRT model of the newest version: top-1 agreement with the SavedModel, accuracy, largest
  probability difference. With ``--run``, int8 models calibrated other ways on the run's training
  sample are compared too (export publishes only one of them).
* raw: each runtime of serve/runtimes.py called in-process on uint8 pixels at batch 1, 32, 64,
  one call after another, with every core (LiteRT: ``num_threads`` = cores).
* HTTP: ``python -m serve`` under gunicorn with ``SERVE_RUNTIME`` set to each runtime in turn
  (``--servers litert,litert@2`` picks them, ``@N`` setting ``SERVE_RUNTIME_THREADS``),
  and the floor, bench/hello_app.py (a fixed JSON answer) under the same gunicorn configuration,
  driven by ``wrk`` posting a prepared multipart body of CIFAR JPEGs (bench/wrk/post_body.lua):
  one image at concurrency 1 and 32, and 64 images per request on two connections. After its
  rows, each server's worker processes' resident memory is read from /proc.

Raw and HTTP rows are measured in ``--repeats`` rounds, each round going through every runtime
(and the floor) once, and the medians compared, so a change in background load during the run
shows up in the per-round numbers instead of favouring one side. Only one server runs at a time;
wrk runs on at most two threads. Percentiles are exact (wrk's latency record via the Lua ``done``
hook, or every timed call in-process).

The agreement section lives in bench/serving_agreement.py, the servers and wrk in bench/serving_http.py.
"""

import argparse
import io
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import zipfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from bench.serving_agreement import agreement_rows  # noqa: E402
from bench.serving_http import FLOOR, multipart, serve_round  # noqa: E402
from serve.backends import published  # noqa: E402
from serve.backends import runtimes  # noqa: E402

RUNTIMES = ("savedmodel", "litert", "litert-int8")
RAW_BATCHES = (1, 32, 64)
TARGETS = {
    "int8_agreement": 0.99,  # int8 top-1 agreement with the SavedModel, all test images
    "int8_accuracy_loss": 0.003,  # at most, accuracy points as a fraction
    "batched_vs_savedmodel": 2.5,  # HTTP 64-image requests, litert / savedmodel, images per second
    "c32_vs_floor": 0.4,  # HTTP single images at c=32, litert / hello-world floor
    "p50_c1_ms": 1.0,  # HTTP p50 at c=1, litert, at most
    "worker_rss_mb": 200,  # resident memory per gunicorn worker, litert, at most
}


# -- inputs ----------------------------------------------------------------------------------
def read_test_jpegs(zip_path, count=None):
    """``[(class folder, file name, bytes)]`` of the archive's test/ split, classes interleaved."""
    with zipfile.ZipFile(zip_path) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith("test/") and n.lower().endswith((".jpg", ".jpeg", ".png")))
        by_class = {}
        for name in names:
            by_class.setdefault(name.split("/")[1], []).append(name)
        picked, total = [], count or len(names)
        while len(picked) < total and any(by_class.values()):
            for files in by_class.values():
                if files and len(picked) < total:
                    picked.append(files.pop(0))
        return [(n.split("/")[1], os.path.basename(n), archive.read(n)) for n in picked]


def decode(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32), Image.Resampling.BILINEAR), np.uint8)


# -- in-process speed ----------------------------------------------------------------------------
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
    return summarise(latencies, len(latencies) * batch, time.perf_counter() - started)


def raw_round(models, images, seconds):
    rows = {}
    for runtime, model in models.items():
        for batch in RAW_BATCHES:
            x = images[:batch]
            rows[(runtime, batch)] = time_calls(lambda x=x: model.pixels(x), batch, seconds)
    return rows


def median_rows(rounds):
    """Per row, the median of each number over the rounds."""
    return {key: {k: statistics.median(r[key][k] for r in rounds) for k in rounds[0][key]} for key in rounds[0]}


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


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def verdict(value, op, target):
    return "met" if (value >= target if op == ">=" else value <= target) else "MISSED"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default="models/cifar10", help="model directory holding version folders N/")
    p.add_argument("--data", default="../shared/data/cifar10-jpeg.zip", help="CIFAR-10 JPEG zip: test/<class>/ images")
    p.add_argument("--run", help="the training run the model came from: adds int8 calibration variants on its samples file")
    p.add_argument("--agreement-images", type=int, default=0, help="test images for the agreement table (0: all)")
    p.add_argument("--duration", type=int, default=5, help="seconds per timed wrk run")
    p.add_argument("--repeats", type=int, default=2, help="rounds over every runtime (medians reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed wrk seconds before each timed run (0: none)")
    p.add_argument("--raw-seconds", type=float, default=2.0, help="seconds per in-process row")
    p.add_argument("--serve-env", action="append", default=[], metavar="KEY=VALUE", help="extra environment for every server")
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
    class_names = served.class_names
    test = read_test_jpegs(args.data, args.agreement_images or None)
    images = np.stack([decode(data) for _, _, data in test])
    labels = np.asarray([class_names.index(folder) for folder, _, _ in test])
    logdir = tempfile.mkdtemp(prefix="bench-serving-")
    bodies = {}
    for n in (1, 64):
        bodies[n] = os.path.join(logdir, f"body-{n}.bin")
        with open(bodies[n], "wb") as f:
            f.write(multipart([(name, data) for _, name, data in test[:n]]))

    print(f"command: python bench/serving.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; model {version_dir}; load average at start {load_average()}")

    agreement = agreement_rows(version_dir, images, labels, args.run)
    print(f"\n### Agreement with the SavedModel ({len(images)} test images)\n")
    print("| model | top-1 agreement | accuracy | accuracy change | max abs prob. diff |")
    print("|---|---:|---:|---:|---:|")
    for name, r in agreement:
        change = (r["accuracy"] - agreement[0][1]["accuracy"]) * 100  # 0.0, not -0.0, for the SavedModel itself
        print(f"| {name} | {r['agreement']:.2%} | {r['accuracy']:.2%} | {change:+.2f} pt | {r['max_abs_diff']:.2g} |")

    cores = len(os.sched_getaffinity(0))
    models = {rt: runtimes.load(rt, version_dir, cores) for rt in RUNTIMES
              if os.path.isfile(os.path.join(version_dir, runtimes.MODEL_FILES[rt]))}
    raw_rounds, http_rounds, rss = [], [], {}
    names = [] if args.skip_http else [*(args.servers.split(",") if args.servers else models), FLOOR]
    for _ in range(args.repeats):
        raw_rounds.append(raw_round(models, images, args.raw_seconds))
        round_rows = {}
        for name in names:
            rows, sizes = serve_round(name, model_dir, bodies, args, logdir)
            round_rows.update({(name, label): r for label, r in rows.items()})
            rss[name] = max(sizes + [rss.get(name, 0.0)]) if sizes else rss.get(name)
        http_rounds.append(round_rows)
    del models

    raw = median_rows(raw_rounds)
    print(f"\n### In-process, one call after another ({args.repeats} rounds, medians; LiteRT on {cores} threads)\n")
    print("| runtime | batch | images/s | p50 ms | p99 ms | img/s per round |")
    print("|---|---:|---:|---:|---:|---|")
    for (runtime, batch), r in raw.items():
        per_round = " / ".join(f"{x[(runtime, batch)]['images_per_s']:.0f}" for x in raw_rounds)
        print(f"| {runtime} | {batch} | {r['images_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {per_round} |")
    if args.skip_http:
        return
    http = median_rows(http_rounds)
    print(f"\n### HTTP through gunicorn ({args.repeats} rounds, medians; wrk {args.duration} s a row after {args.warmup} s warmup)\n")
    if args.serve_env:
        print(f"every server's extra environment: {' '.join(args.serve_env)}\n")
    print("| server | case | images/s | requests/s | p50 ms | p99 ms | img/s per round | worker RSS MB (max) |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for (name, label), r in http.items():
        per_round = " / ".join(f"{x[(name, label)]['images_per_s']:.0f}" for x in http_rounds)
        errors = f" ({r['errors']:.0f} errors)" if r["errors"] else ""
        memory = f"{rss[name]:.0f}" if rss.get(name) else "?"
        print(f"| {name} | {label} | {r['images_per_s']:.0f}{errors} | {r['requests_per_s']:.0f} | {r['p50_ms']:.2f} | "
              f"{r['p99_ms']:.2f} | {per_round} | {memory} |")

    print("\n### Targets\n")
    print("| target | measured | wanted | |")
    print("|---|---:|---:|---|")
    found = dict(agreement)
    checks = []
    if "litert" in found:
        checks.append(("LiteRT float top-1 agreement, all test images", found["litert"]["agreement"], ">=", 1.0, "{:.2%}"))
    if "litert-int8" in found:
        checks.append(("int8 top-1 agreement, all test images", found["litert-int8"]["agreement"], ">=", TARGETS["int8_agreement"], "{:.2%}"))
        checks.append(("int8 accuracy loss, points", found["litert-int8"]["accuracy_loss"] * 100, "<=", TARGETS["int8_accuracy_loss"] * 100, "{:.2f}"))
    if ("litert", "64 images, c=2") in http and ("savedmodel", "64 images, c=2") in http:
        checks.append(("HTTP 64 images/request: litert / savedmodel", http[("litert", "64 images, c=2")]["images_per_s"]
                       / http[("savedmodel", "64 images, c=2")]["images_per_s"], ">=", TARGETS["batched_vs_savedmodel"], "{:.2f}x"))
    if ("litert", "1 image, c=32") in http:
        floor = http[(FLOOR, "1 image, c=32")]["requests_per_s"]
        for runtime in ("litert", "litert-int8"):
            if (runtime, "1 image, c=32") in http:
                checks.append((f"HTTP 1 image c=32: {runtime} / floor", http[(runtime, "1 image, c=32")]["requests_per_s"] / floor,
                               ">=", TARGETS["c32_vs_floor"], "{:.2f}x"))
        checks.append(("HTTP 1 image c=1: litert p50, ms", http[("litert", "1 image, c=1")]["p50_ms"], "<=", TARGETS["p50_c1_ms"], "{:.2f}"))
    if rss.get("litert"):
        checks.append(("worker RSS, litert, MB", rss["litert"], "<=", TARGETS["worker_rss_mb"], "{:.0f}"))
    for name, value, op, target, fmt in checks:
        print(f"| {name} | {fmt.format(value)} | {op} {fmt.format(target)} | {verdict(value, op, target)} |")
    print(f"\nload average at the end: {load_average()}")
    shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    main()
