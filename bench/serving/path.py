"""Where one single-image request's time goes, in-process: the parts behind bench/serving/speed.py's HTTP rows.

Typical usage::

    python -m bench.serving.path --model-dir models/cifar10 --data ../shared/data/cifar10-jpeg.zip

One CIFAR-10 test JPEG is posted as a multipart upload to ``/api/v1/predict`` through Flask's test
client (no socket, no gunicorn), or one stage of that request is called directly. Rows:

* the hello-world app (bench/serving/hello_app.py): Flask and the test client alone, the in-process floor;
* serve with a model that answers at once (the real model's outputs, computed beforehand): the
  server's own path, then the same without its ``before_request``/``after_request`` hooks (API
  keys, security headers, metrics), and its parts called directly: multipart parsing, decoding
  (the server's path, then Pillow alone, which the server keeps for all but plain JPEGs; one image,
  then a 64-image request's), ``InferenceService.classify`` (decoding included), and the JSON answer;
* the model alone, batch 1, on one thread (what each of the default two gunicorn workers gives
  it) and on every core;
* serve with the model in its default runtime and threads.

Each row is the median of ``--calls`` timed calls; rows are measured in ``--repeats`` interleaved
rounds and the medians of the rounds' medians printed, so load that comes and goes touches every row.
"""

import io
import os
import statistics
import tempfile

from bench import harness, record
from bench.serving import hello_app

PREDICT_PATH = "/api/v1/predict"


class Instant:
    """A backend with ``backend``'s info whose ``infer`` returns a prediction made beforehand."""

    kind = "local"
    loaded = True

    def __init__(self, backend, pixels):
        self._info = backend.info()
        self._prediction = backend.infer(pixels)

    def info(self):
        return self._info

    def infer(self, images, version=None):
        return self._prediction

    def run(self, signature_name, inputs, version=None):
        return self._prediction.outputs

    def ready(self):
        return self._info.version

    def close(self):
        pass


def poster(app, body):
    client = app.test_client()

    def post():
        answer = client.post(PREDICT_PATH, data=body, content_type=harness.MULTIPART)
        if answer.status_code != 200:
            raise RuntimeError(f"{answer.status_code}: {answer.get_data(as_text=True)[:200]}")

    return post


def build_rows(model_dir, jpeg, jpegs):
    """``[(label, fn)]``, every row's call ready to time."""
    from flask import jsonify

    from serve import create_app
    from serve.backends import runtimes
    from serve.core import Upload
    from serve.core import decode as images
    from serve.protocols import multipart as uploads

    body = harness.multipart([("image.jpg", jpeg)])
    pillow = images._decode_with_pillow
    served = create_app({"MODEL_DIR": model_dir})
    limit = served.extensions["serve.settings"].max_pixels
    backend = served.extensions["serve.backend"]
    backend.wait_loaded()
    pixels = images.decode(jpeg, limit)[0][None]
    instant = Instant(backend, pixels)
    answered = create_app({"MODEL_DIR": model_dir}, backend=instant)
    bare = create_app({"MODEL_DIR": model_dir}, backend=instant)
    bare.before_request_funcs.clear()
    bare.after_request_funcs.clear()
    service = answered.extensions["serve.service"]
    upload = [Upload("image.jpg", jpeg)]
    result = service.classify(upload, 3)

    def parse():
        with answered.test_request_context(PREDICT_PATH, method="POST", input_stream=io.BytesIO(body),
                                           content_type=harness.MULTIPART, content_length=len(body)):
            uploads.parse()

    def answer_json():
        with answered.app_context():
            jsonify({"model": {"name": result.model.name, "version": result.version},
                     "predictions": [image.public() for image in result.images]})

    version_dir = os.path.join(model_dir, str(backend.info().version))
    cores = len(os.sched_getaffinity(0))
    threads = served.extensions["serve.settings"].runtime_threads or runtimes.default_threads()  # what the served model got
    one_thread = runtimes.load(backend.runtime, version_dir, 1)
    every_core = runtimes.load(backend.runtime, version_dir, cores)
    return [
        ("hello-world app (Flask + test client)", poster(hello_app.create_app(), body)),
        ("serve, model answering at once", poster(answered, body)),
        ("  the same without the before/after hooks", poster(bare, body)),
        ("  multipart parsing (in a request context)", parse),
        ("  decoding the JPEG (the server's path: simplejpeg)", lambda: images.decode(jpeg, limit)),
        ("  decoding the JPEG (Pillow)", lambda: pillow(jpeg, limit)),
        (f"  decoding {len(jpegs)} JPEGs (the server's path)", lambda: images.decode_many(jpegs, limit)),
        (f"  decoding {len(jpegs)} JPEGs (Pillow)", lambda: [pillow(data, limit) for data in jpegs]),
        ("  InferenceService.classify, decoding included", lambda: service.classify(upload, 3)),
        ("  the JSON answer", answer_json),
        (f"model alone ({backend.runtime}), batch 1, 1 thread", lambda: one_thread.pixels(pixels)),
        (f"model alone ({backend.runtime}), batch 1, {cores} threads", lambda: every_core.pixels(pixels)),
        (f"serve with the model ({backend.runtime}, {threads} thread{'s' * (threads > 1)})", poster(served, body)),
    ]


def main(argv=None):
    p = harness.arguments(__doc__)
    p.add_argument("--calls", type=int, default=2000, help="timed calls per row and round")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds over every row")
    args = p.parse_args(argv)
    # Metrics as under gunicorn: prometheus-client's multiprocess files.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="bench-serving-path-")
    jpegs = [data for _, _, data in harness.read_test_images(args.data, 64)]
    rows = build_rows(os.path.abspath(args.model_dir), jpegs[0], jpegs)
    rounds = [[harness.median_ms(fn, args.calls) for _, fn in rows] for _ in range(args.repeats)]
    p50 = {label: statistics.median(r[index] for r in rounds) for index, (label, _) in enumerate(rows)}
    print(f"| stage | p50 ms (median of {args.repeats} rounds) | per round |")
    print("|---|---:|---|")
    for index, (label, _) in enumerate(rows):
        print(f"| {label} | {p50[label]:.3f} | {' / '.join(f'{r[index]:.3f}' for r in rounds)} |")
    record.write(args.json, {"model_dir": args.model_dir, "p50_ms": p50, "rounds_ms": rounds}, __spec__.name, argv)


if __name__ == "__main__":
    main()
