"""Slow clients against one server: how normal requests fare while N connections trickle a body.

Typical usage::

    python -m bench.serving.slow_clients --server gunicorn --model-dir bench/peers/.cache/models
    python -m bench.serving.slow_clients --server granian ...   # the granian extra: pip install ".[granian]"
    python -m bench.serving.slow_clients --server gunicorn --nginx  # behind nginx (Debian's), which buffers bodies

Starts ``python -m serve --server SERVER`` (2 workers x 16 threads under gunicorn or granian), then for each N of ``--slow``: opens N connections that each send a
``POST`` to TF Serving's predict route declaring a 100,000-byte body and then one byte a second (a
slow or hostile client, as the hostile-use issue found: about 16 fill a worker), and meanwhile one
normal client sends single-image JSON requests one after another for ``--seconds``, each with a 5 s
timeout. Prints, per N: requests answered, failed (timeouts, resets, non-200), p50 and p99.

With ``--nginx`` the clients talk to an nginx on ``--port`` that proxies to the server on the next
port, with nginx's defaults for request bodies (``proxy_request_buffering on``: a body reaches the
server only once nginx has all of it), as ingress-nginx proxies by default in Kubernetes.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import requests

from bench import harness, record

PATH = "/v1/models/cifar10:predict"


def start(server, model_dir, port):
    env = {"MODEL_BASE_PATH": os.path.abspath(model_dir), "MODEL_NAME": "cifar10", "GRPC_PORT": "0", "MALLOC_ARENA_MAX": "2",
           "PORT": str(port), "HOST": "127.0.0.1", "SERVE_SERVER": server}
    process = harness.Server([sys.executable, "-m", "serve"], env)
    process.wait_ready(f"http://127.0.0.1:{port}/readyz", timeout_s=180)
    return process


NGINX_CONF = """
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    client_max_body_size 8m;
    client_body_buffer_size 1m;  # bodies held in memory: the worker needs no temporary files
    upstream serve {{ server 127.0.0.1:{upstream}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://serve;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def start_nginx(port, upstream):
    root = tempfile.mkdtemp(prefix="slow-clients-nginx-")
    conf = os.path.join(root, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(root=root, port=port, upstream=upstream))
    return subprocess.Popen(["nginx", "-c", conf, "-p", root, "-g", "daemon off;"], stderr=subprocess.DEVNULL)


def trickle(port, count, stop):
    """``count`` connections declaring a 100,000-byte body, each sent a byte a second until ``stop``."""
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n").encode()
    sockets = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(head + b"[")
        sockets.append(s)
    while not stop.wait(1.0):
        for s in list(sockets):
            try:
                s.sendall(b"1")
            except OSError:
                sockets.remove(s)  # the server closed it: that is one way to cope
    for s in sockets:
        s.close()
    return sockets


def measure(port, seconds, body):
    session = requests.Session()
    latencies, failures = [], 0
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        started = time.perf_counter()
        try:
            response = session.post(f"http://127.0.0.1:{port}{PATH}", data=body,
                                    headers={"Content-Type": "application/json"}, timeout=5)
            if response.status_code == 200:
                latencies.append(time.perf_counter() - started)
            else:
                failures += 1
        except requests.RequestException:
            failures += 1
            session = requests.Session()
    return latencies, failures


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", choices=("gunicorn", "granian"), default="gunicorn")
    p.add_argument("--model-dir", default="bench/peers/.cache/models", help="the models/ root holding cifar10/N/")
    p.add_argument("--slow", default="0,16,32,64", help="slow connections, comma-separated")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--port", type=int, default=8000, help="where the clients connect")
    p.add_argument("--nginx", action="store_true", help="put nginx (body buffering on) in front of the server")
    p.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    args = p.parse_args(argv)
    body = json.dumps({"instances": np.random.default_rng(0).integers(0, 256, (1, 32, 32, 3)).tolist()})
    proxy = start_nginx(args.port, args.port + 1) if args.nginx else None
    process = start(args.server, args.model_dir, args.port + 1 if args.nginx else args.port)
    rows = {}
    try:
        print(f"{args.server}, 2 workers x 16 threads{', behind nginx' if proxy else ''}")
        print("| slow connections | answered | failed | p50 ms | p99 ms |")
        print("|---:|---:|---:|---:|---:|")
        for count in (int(n) for n in args.slow.split(",")):
            stop = threading.Event()
            slow = threading.Thread(target=trickle, args=(args.port, count, stop), daemon=True)
            slow.start()
            time.sleep(2)  # the slow connections reach the server first
            latencies, failures = measure(args.port, args.seconds, body)
            stop.set()
            slow.join()
            ms = sorted(x * 1000 for x in latencies)
            p50 = f"{statistics.median(ms):.2f}" if ms else "-"
            p99 = f"{ms[min(len(ms) - 1, int(len(ms) * 0.99))]:.2f}" if ms else "-"
            print(f"| {count} | {len(ms)} | {failures} | {p50} | {p99} |")
            rows[str(count)] = {"answered": len(ms), "failed": failures, "p50_ms": statistics.median(ms) if ms else None,
                                "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))] if ms else None}
    finally:
        process.stop()
        if proxy is not None:
            proxy.terminate()
            proxy.wait(30)
    record.write(args.json, {"server": args.server, "nginx": args.nginx, "slow_connections": rows}, __spec__.name, argv)


if __name__ == "__main__":
    main()
