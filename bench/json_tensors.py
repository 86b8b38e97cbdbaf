"""Reading a JSON batch of images: serve/json_tensors.py against orjson and the standard json, each then np.asarray.

Typical usage::

    python bench/json_tensors.py [--rounds 200]

A TF Serving ``instances`` body of 1 and of 64 random 32x32x3 images (integers 0-255, written by
``json.dumps`` as clients write them: ``", "`` between values) is read into an array by each way,
in interleaved rounds, so load that comes and goes touches every row; the median and the best of
the rounds are printed, milliseconds a body, with the machine's CPU and load.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import orjson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.serving import cpu_model  # noqa: E402
from serve.http import json_tensors  # noqa: E402

WAYS = {
    "serve.json_tensors": lambda body: json_tensors.loads(body, "instances")["instances"],
    "orjson + np.asarray": lambda body: np.asarray(orjson.loads(body)["instances"]),
    "json + np.asarray": lambda body: np.asarray(json.loads(body)["instances"]),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200, help="timed reads of each body by each way (a tenth for 64 images)")
    args = p.parse_args(argv)
    print(f"command: python bench/json_tensors.py --rounds {args.rounds}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| images | way | median ms | best ms | median vs serve.json_tensors |")
    print("|---:|---|---:|---:|---:|")
    for images in (1, 64):
        pixels = np.random.default_rng(images).integers(0, 256, (images, 32, 32, 3))
        body = json.dumps({"instances": pixels.tolist()}).encode()
        for way in WAYS.values():
            assert np.array_equal(way(body), pixels)
        times = {name: [] for name in WAYS}
        for _ in range(args.rounds if images == 1 else max(5, args.rounds // 10)):
            for name, way in WAYS.items():
                started = time.perf_counter()
                way(body)
                times[name].append(time.perf_counter() - started)
        ours = statistics.median(times["serve.json_tensors"])
        for name, taken in times.items():
            median = statistics.median(taken)
            print(f"| {images} | {name} | {median * 1000:.3f} | {min(taken) * 1000:.3f} | {median / ours:.2f}x |")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
