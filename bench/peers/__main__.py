"""This project's server against the servers a user would pick instead, on the same model and requests.

Typical usage::

    python -m bench.peers                                 # every server, 10 s a cell
    python -m bench.peers --only this,kserve --duration 5
    python -m bench.peers --model-dir models/cifar10      # a real trained export
    python -m bench.peers --json bench/records/serving-peers-NAME.json

Servers, one after another, each alone on the machine: this project (``python -m serve``, its
defaults: gunicorn, 2 workers x 16 threads, LiteRT float, its gRPC server on), KServe's
``ModelServer`` (``--workers 2``), BentoML (``workers=2``, adaptive batching), LitServe
(``workers_per_device=2``, batching up to 32 requests in 5 ms) and the hello-world floor
(bench/serving/hello_app.py under this project's gunicorn configuration). Each peer runs from its own
virtual environment of exact pins (bench/peers/requirements-*.txt, made under bench/peers/.venvs/
on first use) and serves the same ``model.tflite`` with LiteRT's interpreter
(bench/peers/litert_model.py, as many threads as cores, as this project does).

Requests (bench/peers/load.py): JSON ``instances`` (ints 0-255, [N, 32, 32, 3]) on each server's
route for it, multipart PNG uploads where the server takes files, v2 JSON where it speaks the
Open Inference Protocol; 1 image at c=1 and c=32, 64 images a request at c=2; wrk with the
latency record (exact p50/p99), non-2xx answers, socket errors and timeouts counted. Before each
cell, one request from Python is checked against this project's LiteRT runtime run in-process on
the same images (top class of every image, probabilities within 1e-4 where the answer has them).
Without ``--model-dir``, a seed_cnn trained for one epoch on synthetic images is made and cached
(bench/peers/model.py): weights do not change the speed.

Prints one markdown table (server x cell); ``--json`` writes the record.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench import harness, record
from bench.peers import grpc_load, load, servers
from bench.peers.litert_model import model_file
from bench.peers.model import ensure_model, png, request_images, version_dir


def reference(model_dir, images):
    """This project's answer for ``images``: its LiteRT runtime, in this process."""
    from serve.backends import runtimes

    return runtimes.load("litert", version_dir(model_dir)).pixels(images)["probabilities"]


def serve_round(name, model_dir, bodies, expected, args, logdir):
    port, grpc_port = harness.free_port(), harness.free_port()
    argv, env = servers.command(name, model_dir, port, grpc_port)
    server = harness.Server(argv, env, os.path.join(logdir, f"{name.replace(' ', '-')}.log"))
    base = f"http://127.0.0.1:{port}"
    routes = servers.ROUTES[name]
    cells = [c for c in load.CELLS if c.kind in routes and (name not in servers.FLOORS or c.key in servers.FLOOR_CELLS)]
    result = {"cells": {}, "load_average": os.getloadavg()[0]}
    try:
        path, content_type = bodies[("json", 1)]
        with open(path, "rb") as f:
            server.wait_ready(base + routes["json"], f.read(), content_type)
        for cell in cells:
            if cell.kind in load.GRPC_KINDS:
                row = grpc_cell(name, cell, f"127.0.0.1:{grpc_port}", expected, args)
                result["cells"][cell.key] = row
                print(f"  {name}: {cell.label}: {load.format_cell(cell, row)}", flush=True)
                continue
            path, content_type = bodies[(cell.kind, cell.images)]
            url = base + routes[cell.kind]
            row = {}
            if name not in servers.FLOORS:
                with open(path, "rb") as f:
                    status, answer = harness.post(url, f.read(), content_type)
                row["wrong"] = load.check_answer(json.loads(answer), expected[: cell.images])
            if args.warmup:
                harness.run_wrk(url, path, content_type, cell.threads, cell.connections, args.warmup)
            row.update(harness.run_wrk(url, path, content_type, cell.threads, cell.connections, args.duration))
            result["cells"][cell.key] = row
            print(f"  {name}: {cell.label}: {load.format_cell(cell, row)}", flush=True)
        sizes = harness.process_rss_mb(server.proc.pid)
        result["rss_mb"], result["largest_process_mb"] = sum(sizes), max(sizes, default=0)
    except Exception as e:  # report the server that failed and go on with the others
        result["failed"] = f"{type(e).__name__}: {e}"
        print(f"  {name} failed: {result['failed']} (log: {server.log.name})", flush=True)
    finally:
        server.stop()
    return result


def grpc_cell(name, cell, target, expected, args):
    """A gRPC cell, driven from a separate Python process (``python -m bench.peers.grpc_load``) as wrk drives the HTTP ones."""
    kind = load.GRPC_KINDS[cell.kind]
    row = {"wrong": grpc_load.wrong(target, kind, request_images(cell.images), expected[: cell.images])}
    argv = [sys.executable, "-m", "bench.peers.grpc_load", "--target", target, "--kind", kind, "--images", str(cell.images),
            "--concurrency", str(cell.connections)]
    if args.warmup:
        subprocess.run([*argv, "--seconds", str(args.warmup)], cwd=harness.ROOT, check=True, capture_output=True)
    done = subprocess.run([*argv, "--seconds", str(args.duration)], cwd=harness.ROOT, check=True, capture_output=True, text=True)
    row.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return row


def limit_line(limit):
    one, b32, b64 = limit["batch_1"], limit["batch_32"], limit["batch_64"]
    return (f"1 image a call p50 {one['p50_ms']:.2f} ms; 32 images a call {b32['images_per_s']:,.0f} img/s; "
            f"64 images a call {b64['images_per_s']:,.0f} img/s")


#: The bare model's figure quoted beside each cell's (None: none is comparable).
LIMIT_OF = {"c1": ("batch_1", "p50_ms"), "c32": None, "c2": ("batch_64", "images_per_s")}


def record_table(results, names, headers, limit):
    """The record's ``table``: a row per cell and figure, a column per server, then the bare model's limit."""
    metrics = (("p50 (ms)", "p50_ms", 1, "{:.2f}"), ("p99 (ms)", "p99_ms", 1, "{:.1f}"))
    rows = []
    for cell in load.CELLS:
        got = [results.get(n, {}).get("cells", {}).get(cell.key) for n in names]
        if not any(got):
            continue
        if cell.connections == 1:
            figures = metrics
        else:
            per = "images/s" if cell.images > 1 else "requests/s"
            figures = ((per, "requests_per_s", cell.images, "{:,.0f}"), metrics[1])
        for label, key, scale, fmt in figures:
            bare = LIMIT_OF[f"c{cell.connections}"]
            bare = fmt.format(limit[bare[0]][bare[1]]) if bare and key != "p99_ms" and (cell.images > 1) == (bare[0] != "batch_1") else None
            row = [f"{cell.label}: {label}"]
            for r in got:
                bad = r and (load.errors(r) or r.get("wrong"))
                row.append(None if not r or not r.get("requests") else fmt.format(r[key] * scale) + (" (errors)" if bad else ""))
            rows.append(row + [bare])
    for label, key in (("resident memory, all processes (MB)", "rss_mb"), ("resident memory, largest process (MB)", "largest_process_mb")):
        rows.append([label] + [f"{results[n][key]:,.0f}" if results.get(n, {}).get(key) else None for n in names] + [None])
    return {"columns": ["cell", *headers, "bare model (the limit)"], "rows": rows}


def record_targets(results, limit, model):
    """Issue 56's targets for the default server (gunicorn), against the best peer that answered each cell."""
    def cell(name, key):
        row = results.get(name, {}).get("cells", {}).get(key)
        return row if row and row.get("requests") else None

    peers = [n for n in servers.PEERS if n in results]

    def against_best(key, figure, best, target, bound, limit_value):
        ours, theirs = cell(servers.THIS, key), [cell(n, key)[figure] for n in peers if cell(n, key)]
        if ours and theirs:
            targets.append({"target": f"{model}, {target}", "measured": ours[figure] / best(theirs), bound: limit_value,
                            "format": "{:.2f}x"})
        return ours

    targets = []
    against_best("json-1-c32", "requests_per_s", max, "1 image, c=32: ≥ 1.5x the best peer's requests/s", "at_least", 1.5)
    ours = against_best("json-1-c1", "p50_ms", min, "1 image, c=1: p50 ≤ 0.8x the best peer's", "at_most", 0.8)
    floor = cell(servers.FLOOR, "json-1-c1")
    if ours and floor:
        over = ours["p50_ms"] - floor["p50_ms"] - limit["batch_1"]["p50_ms"]
        targets.append({"target": f"{model}, 1 image, c=1: p50 ≤ the floor's + the bare model's call + 0.5 ms", "measured": over,
                        "at_most": 0.5, "format": "{:+.2f} ms"})
    against_best("json-64-c2", "requests_per_s", max, "64 images a request over JSON: ≥ 2x the best peer", "at_least", 2.0)
    for key, what in (("grpc-tfs-64-c2", "TF Serving gRPC"), ("grpc-v2-64-c2", "v2 gRPC")):
        ours = cell(servers.THIS, key)
        if ours:
            targets.append({"target": f"{model}, 64 images over {what}: ≥ 0.8x the bare model's batch-64 images/s",
                            "measured": ours["requests_per_s"] * 64 / limit["batch_64"]["images_per_s"], "at_least": 0.8,
                            "format": "{:.2f}x"})
    ours = results.get(servers.THIS, {}).get("cells", {})
    if ours:
        bad = sum(1 for row in ours.values() if load.errors(row) or row.get("wrong"))
        targets.append({"target": f"{model}: cells with an error, a timeout or a wrong answer", "measured": bad, "at_most": 0,
                        "format": "{:d}"})
    return targets


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="this,kserve,bentoml,litserve,floor", help="servers to run, comma-separated (default: all)")
    parser.add_argument("--model-dir", help="a models/NAME/ root of an export (default: a cached synthetic model)")
    parser.add_argument("--architecture", default="seed_cnn", choices=("seed_cnn", "airbench_muon"),
                        help="the cached synthetic model's architecture (default seed_cnn; airbench_muon: the main job's default)")
    parser.add_argument("--duration", type=int, default=10, help="seconds of wrk per cell (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="seconds of wrk before each cell, not counted (default 3)")
    parser.add_argument("--rounds", type=int, default=1, help="times through every server; the table shows each cell's median (default 1)")
    parser.add_argument("--json", default=os.path.join("bench", "results", "serving-peers.json"),
                        help="write the record here (default: bench/results/serving-peers.json; bench/records/NAME.json to keep it)")
    args = parser.parse_args(argv)
    names = servers.resolve(args.only)

    model_dir = ensure_model(args.model_dir, architecture=args.architecture)
    versions = {}
    for name in names:
        if name in servers.PEERS:
            servers.ensure_venv(name)
            versions[name] = servers.installed_version(name)
    images = request_images(64)
    expected = reference(model_dir, images)
    rounds, limits = [], []
    with tempfile.TemporaryDirectory(prefix="serving-peers-") as tmp:
        bodies = load.write_bodies(tmp, images, [png(image) for image in images])
        logdir = os.path.join(harness.ROOT, "bench", "results", "serving_peers_logs")
        os.makedirs(logdir, exist_ok=True)
        for number in range(1, args.rounds + 1):
            rounds.append({})
            limits.append(grpc_load.bare_model(model_file(model_dir), images))
            print(f"bare model (round {number}): " + limit_line(limits[-1]), flush=True)
            for name in names:
                print(f"{name} (round {number} of {args.rounds}):", flush=True)
                rounds[-1][name] = serve_round(name, model_dir, bodies, expected, args, logdir)
    results = load.combine(rounds)

    headers = [f"{servers.VERSIONS[n]} {versions[n]}" if n in versions else n for n in names]
    table = load.markdown({h: results[n] for h, n in zip(headers, names)}, headers)
    print()
    print(f"{args.duration} s a cell after {args.warmup} s of warm-up, {args.rounds} round(s); model {model_dir}")
    print("c=1: p50 / p99; c=32: requests/s (p99); 64 images: images/s (p99); medians over the rounds; errors shown where any")
    print(table)
    limit = {key: {k: statistics.median(r[key][k] for r in limits) for k in ("p50_ms", "images_per_s")} for key in limits[0]}
    print("The limit, the bare model (LiteRT in one process, as many threads as cores, no server), medians: " + limit_line(limit))
    failed = {n: r["failed"] for n, r in results.items() if "failed" in r}
    for n, why in failed.items():
        print(f"{n} failed: {why}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    model = args.model_dir or f"{args.architecture} (synthetic, 1 epoch)"
    record.write(args.json, {"model": model, "duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds,
                             "versions": versions, "servers": results, "bare_model": limit, "bare_model_rounds": limits,
                             "table": record_table(results, names, headers, limit),
                             "targets": record_targets(results, limit, args.model_dir or args.architecture)},
                 __spec__.name, argv)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
