"""Reading a JSON batch of images: serve/http/json_tensors.py against orjson and the standard json, each then np.asarray.

Typical usage::

    python -m bench.serving.json_tensors [--rounds 200] [--json bench/records/NAME.json]

A TF Serving ``instances`` body of 1 and of 64 random 32x32x3 images (integers 0-255, written by
``json.dumps`` as clients write them: ``", "`` between values) is read into an array by each way,
in interleaved rounds, so load that comes and goes touches every row; the median and the best of
the rounds are printed, milliseconds a body.
"""

import argparse
import json
import statistics
import time

import numpy as np
import orjson

from bench import record
from serve.http import json_tensors

WAYS = {
    "serve.json_tensors": lambda body: json_tensors.loads(body, "instances")["instances"],
    "orjson + np.asarray": lambda body: np.asarray(orjson.loads(body)["instances"]),
    "json + np.asarray": lambda body: np.asarray(json.loads(body)["instances"]),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200, help="timed reads of each body by each way (a tenth for 64 images)")
    p.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    args = p.parse_args(argv)
    medians = {}
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
            medians.setdefault(str(images), {})[name] = median * 1000
            print(f"| {images} | {name} | {median * 1000:.3f} | {min(taken) * 1000:.3f} | {median / ours:.2f}x |")
    record.write(args.json, {"median_ms": medians}, __spec__.name, argv)


if __name__ == "__main__":
    main()
