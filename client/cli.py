"""Classify images from a terminal, through this project's server or straight at TF Serving.

Typical usage::

    client predict photo.png holiday/ 'scans/*.jpg' --top-k 5
    client predict images/ --json --batch-size 64 > predictions.jsonl
    client health
    client info --url http://models.internal:8000
    client predict cat.png --via tfserving-grpc --url localhost:8500 --model-name cifar10
    client predict cat.png --via v2 --url http://triton:8000     # the Open Inference Protocol (KServe v2)
    client predict cat.png --via grpc --version-label canary     # this server's gRPC port, TF Serving's API
    client predict cat.png --via v2-grpc --url localhost:8500 --version 2

The client sends each file's bytes as they are; the server decodes and resizes them. Exit
codes: 0 all classified, 1 some files failed, 2 usage errors (a missing or wrong API key too), 3 server
unreachable or not ready. A server that needs an API key gets it from ``$CLIENT_API_KEY`` (or
``--api-key``, which other users of the machine can see in its process list).

The server is not trusted to behave. Each request must be answered whole within ``--timeout``
seconds (connecting, sending, and reading the whole answer, however slowly the server trickles it;
each retry after a 429 or 503 gets its own), or the client gives up with exit 3. An answer is read
up to 16 MiB (:data:`client.transports.common.MAX_ANSWER_BYTES`). No redirect is followed, to the
same host or another (where the images would be sent): a 3xx is one line naming where it points, and
exit 1; give that address as ``--url`` if it is meant. An answer that is not what its protocol says
(not JSON, a ``null`` probability, a classification with no class, counts that do not match) is
one line naming what is wrong, and exit 1, never a traceback. Labels, messages and every other
text from the server are printed with their control characters escaped (``\\x1b``, ``\\u202e``), so
a server cannot drive the terminal; ``--json`` output is JSON with every non-ASCII character
escaped.
"""

import argparse
import glob
import json
import os
import shutil
import sys

import contract
from client import output, transports
from contract.arguments import add_renamed, non_negative_int, positive_float, positive_int

DEFAULT_URL = "http://localhost:8000"
#: Where each --via looks when no --url is given: TF Serving's own default ports; v2 on this server's
#: (Triton's HTTP port is 8000 as well).
#: gRPC (TF Serving's API or v2) on this server's GRPC_PORT, which is TF Serving's gRPC port too.
DEFAULT_URLS = {"api": DEFAULT_URL, "tfserving-rest": "http://localhost:8501", "tfserving-grpc": "localhost:8500", "v2": DEFAULT_URL,
                "grpc": "localhost:8500", "v2-grpc": "localhost:8500"}
#: The transports that can name a version by number, and those that can name one by label.
VERSIONED = ("tfserving-rest", "tfserving-grpc", "grpc", "v2", "v2-grpc")
LABELLED = ("tfserving-rest", "tfserving-grpc", "grpc")
URL_ENV = "CLIENT_URL"
API_KEY_ENV = "CLIENT_API_KEY"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_TOP_K = 3
DEFAULT_BATCH_SIZE = 16
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
#: ``predict --fail-on-ood``: every file was answered, and at least one looks like none of the classes.
EXIT_OUT_OF_DISTRIBUTION = 4


class UsageError(Exception):
    """A problem with what the user asked for: exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line per problem, as for every other error; `client COMMAND --help` has the usage.
        self.exit(EXIT_USAGE, f"client: {self.prog}: {message}\n")


def build_parser():
    parser = _Parser(prog="client", description="Classify images with the served model.")
    common = _Parser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get(URL_ENV),
        help=f"server address (default ${URL_ENV}, else {DEFAULT_URL} for the API and v2, "
        "localhost:8501 for TF Serving REST, localhost:8500 for gRPC); redirects are not followed, "
        "to this host or another: the client stops and names where the server points",
    )
    common.add_argument(
        "--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S,
        help="seconds each request may take in all: connecting, sending, and reading the whole answer, however "
        "slowly the server sends it (then exit 3); each retry after a 429 or 503 gets its own (default %(default)g)",
    )
    common.add_argument(
        "--retries", type=non_negative_int, default=transports.DEFAULT_RETRIES,
        help="times to send a request again when the server answers 429 or 503, after the wait its Retry-After "
        "asks for (HTTP; default %(default)s); then the client stops with one line and exit 1 (429) or 3 (503)",
    )
    common.add_argument(
        "--max-wait", type=positive_float, default=transports.DEFAULT_MAX_WAIT_S,
        help="longest wait before sending again, in seconds, whatever Retry-After asks (default %(default)g)",
    )
    common.add_argument(
        "--via",
        choices=sorted(DEFAULT_URLS),
        default="api",
        help="talk to this project's server (api, default; grpc: its gRPC port, TF Serving's gRPC API), straight to "
        "TF Serving over REST or gRPC (tfserving-rest, tfserving-grpc), or over the Open Inference Protocol "
        "(v2 over HTTP, v2-grpc: this server, Triton, KServe, MLServer)",
    )
    which = common.add_mutually_exclusive_group()
    which.add_argument(
        "--version", type=positive_int, default=None,
        help="ask this version of the model by number (TF Serving's and v2's modes; default: the server's newest)",
    )
    which.add_argument(
        "--version-label", metavar="LABEL", default=None,
        help="ask the version a label names, e.g. stable or canary (TF Serving's REST and gRPC modes, grpc)",
    )
    add_renamed(
        common, "--model-name", "--model", default=contract.DEFAULT_MODEL_NAME,
        help="model name, for the TF Serving and v2 modes (default %(default)s)",
    )
    common.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"key for a server that needs one, sent as 'Authorization: Bearer KEY' over HTTP and as the "
        f"'authorization' metadata over gRPC (default ${API_KEY_ENV}, which keeps it out of the process list)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    predict = commands.add_parser("predict", parents=[common], help="classify image files, directories or globs")
    predict.add_argument("paths", nargs="+", metavar="FILE|DIR|GLOB", help="images; directories are searched for image files")
    predict.add_argument("--top-k", type=positive_int, default=DEFAULT_TOP_K, help="how many best classes to show (default %(default)s)")
    predict.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, help="images per request (default %(default)s)")
    predict.add_argument("--json", action="store_true", help="print one JSON object per image instead of a table")
    predict.add_argument(
        "--fail-on-ood", action="store_true",
        help=f"exit {EXIT_OUT_OF_DISTRIBUTION} when the model answers in_distribution: false for any image (it looks "
             "like none of the classes); the labels are printed either way",
    )
    predict.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal and the files fill more than a screen)",
    )
    commands.add_parser("health", parents=[common], help="say whether the model is ready")
    info = commands.add_parser("info", parents=[common], help="show the model's name, version, classes and signatures")
    info.add_argument("--json", action="store_true", help="print the answer as JSON")
    return parser



def make_transport(via, url, model, timeout, retries=transports.DEFAULT_RETRIES, max_wait=transports.DEFAULT_MAX_WAIT_S,
                   version=None, label=None):
    """The transport ``via`` names, to ``url`` (None: its default), asking ``version`` or ``label`` where it can."""
    if version is not None and via not in VERSIONED:
        raise UsageError(f"--via {via} answers with the server's newest version; --version needs one of {', '.join(VERSIONED)}")
    if label is not None and via not in LABELLED:
        raise UsageError(f"--via {via} cannot name a version by label (the Open Inference Protocol has none); "
                         f"--version-label needs one of {', '.join(LABELLED)}")
    url = url or DEFAULT_URLS[via]
    retry = {"retries": retries, "max_wait_s": max_wait}
    if via == "api":
        return transports.ApiTransport(url, timeout, **retry)
    if via == "tfserving-rest":
        return transports.TFServingRestTransport(url, model, timeout, version=version, label=label, **retry)
    if via == "v2":
        return transports.V2Transport(url, model, timeout, version=version, **retry)
    target = url.split("://", 1)[-1].rstrip("/")  # gRPC wants host:port
    if via == "v2-grpc":
        return transports.V2GrpcTransport(target, model, timeout, version=version)
    return transports.TFServingGrpcTransport(target, model, timeout, version=version, label=label)


def find_images(paths):
    """The files named, the image files under directories, and the matches of globs, in order, once each."""
    found, seen = [], set()

    def add(path):
        key = os.path.abspath(path)
        if key not in seen:
            seen.add(key)
            found.append(path)

    def walk(directory):
        images = []
        for root, dirs, files in os.walk(directory):
            dirs.sort()
            images += [os.path.join(root, f) for f in sorted(files) if f.lower().endswith(IMAGE_EXTENSIONS)]
        if not images:
            raise UsageError(f"{directory}: no image files found ({', '.join(IMAGE_EXTENSIONS)})")
        return images

    for path in paths:
        if os.path.isdir(path):
            for image in walk(path):
                add(image)
        elif os.path.isfile(path):
            add(path)
        elif glob.has_magic(path):
            matches = sorted(glob.glob(path, recursive=True))
            files = [m for m in matches if os.path.isfile(m)]
            for directory in (m for m in matches if os.path.isdir(m)):
                files += walk(directory)
            if not files:
                raise UsageError(f"{path}: no files match")
            for f in files:
                add(f)
        else:
            raise UsageError(f"{path}: no such file or directory")
    return found


class Progress:
    """A one-line bar on stderr, redrawn in place."""

    def __init__(self, total, enabled):
        self.total, self.done, self.enabled = total, 0, enabled

    def advance(self, n):
        self.done += n
        if self.enabled:
            width = 30
            filled = width * self.done // max(self.total, 1)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def classify(transport, files, batch_size, top_k, progress):
    """Yield (file, result) for every file, in order; a result holds ``error`` if that file failed."""
    for start in range(0, len(files), batch_size):
        names = files[start : start + batch_size]
        batch = []
        for name in names:
            with open(name, "rb") as f:
                batch.append((os.path.basename(name), f.read()))
        try:
            results = transport.predict(batch, top_k)
        except transports.RequestFailed as error:
            if error.status not in (400, "INVALID_ARGUMENT"):
                # 401: no key or a wrong one; 429: over the limit after every retry; 413, 5xx: the
                # server refuses the request as such. Every other request would fail the same way,
                # and sending the images one by one would only multiply the load.
                raise
            if len(batch) == 1:
                results = [{"error": str(error), "status": error.status}]
            else:
                # A 400 (gRPC: INVALID_ARGUMENT): TF Serving refuses a whole batch for one bad image;
                # ask again one by one to name it.
                results = []
                for item in batch:
                    try:
                        results += transport.predict([item], top_k)
                    except transports.RequestFailed as single:
                        results.append({"error": str(single), "status": single.status})
        progress.advance(len(names))
        yield from zip(names, results)


def run_predict(args, transport):
    files = find_images(args.paths)
    screen = shutil.get_terminal_size().lines
    show = args.progress if args.progress is not None else (sys.stderr.isatty() and len(files) > screen)
    progress = Progress(len(files), show)
    failures = foreign = 0
    rows = []
    for name, result in classify(transport, files, args.batch_size, args.top_k, progress):
        if "error" in result:
            failures += 1
            status = f" (HTTP {result['status']})" if isinstance(result.get("status"), int) else (f" ({result['status']})" if result.get("status") else "")
            output.say(f"{name}: {result['error']}{status}")
            if args.json:
                print(json.dumps({"file": name, "error": result["error"], "status": result.get("status")}), flush=True)
            continue
        foreign += result.get("in_distribution") is False
        if args.json:
            print(json.dumps({"file": name, **result}), flush=True)
        else:
            rows.append((output.printable(name), output.label(result), f"{result['probability']:.3f}", output.verdict(result),
                         output.format_top_k(result.get("top_k", []))))
    if not args.json and rows:
        header = ("FILE", "LABEL", "PROBABILITY", "IN-DISTRIBUTION", f"TOP-{args.top_k}")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    if failures:
        output.say(f"{failures} of {len(files)} files failed")
        return EXIT_FAILED
    if foreign and args.fail_on_ood:
        output.say(f"{foreign} of {len(files)} images look like none of the classes (in_distribution: false)")
        return EXIT_OUT_OF_DISTRIBUTION
    return EXIT_OK


def run_health(args, transport):
    health = transport.health()
    print(f"ready: {json.dumps(health, sort_keys=True)}")
    return EXIT_OK


def run_info(args, transport):
    info = transport.info()
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return EXIT_OK
    print(f"model:        {output.text(info.get('name'))}")
    print(f"version:      {output.text(info.get('version'))}")
    if info.get("architecture"):
        print(f"architecture: {output.text(info['architecture'])}")
    classes = info.get("class_names")
    if isinstance(classes, list) and classes:
        classes = ", ".join(map(output.text, classes))
    print(f"classes:      {output.text(classes) if classes else '(not reported by this server)'}")
    print("signatures:")
    signatures = info.get("signatures") or {}
    for name, signature in sorted(signatures.items()) if isinstance(signatures, dict) else [("?", signatures)]:
        if isinstance(signature, dict) and ("inputs" in signature or "outputs" in signature):
            ins = ", ".join(output.names(signature.get("inputs")))
            outs = ", ".join(output.names(signature.get("outputs")))
            print(f"  {output.text(name)}: ({ins}) -> ({outs})")
        else:
            print(f"  {output.text(name)}: {json.dumps(signature, sort_keys=True)}")
    if info.get("backend"):
        print(f"backend:      {output.text(info['backend'])}")
    return EXIT_OK


COMMANDS = {"predict": run_predict, "health": run_health, "info": run_info}


def main(argv=None):
    """Parse ``argv``, run the command, and return the exit code (0, 1, 2 or 3)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # argparse has printed its one-line usage error
        return exit.code if isinstance(exit.code, int) else EXIT_USAGE
    try:
        transport = transports.authorize(
            make_transport(args.via, args.url, args.model_name, args.timeout, args.retries, args.max_wait, args.version,
                           args.version_label), args.api_key
        )
        return COMMANDS[args.command](args, transport)
    except UsageError as error:
        output.say(error)
        return EXIT_USAGE
    except transports.Unreachable as error:
        output.say(error)
        return EXIT_UNREACHABLE
    except transports.RequestFailed as error:
        if error.status in (401, "UNAUTHENTICATED"):
            output.say(f"{error} ({'HTTP 401' if error.status == 401 else error.status}): give the key with ${API_KEY_ENV} or --api-key")
            return EXIT_USAGE
        if error.status == 429:
            output.say(f"{error} (HTTP 429, still refused after {args.retries} retries)")
            return EXIT_FAILED
        output.say(error)
        return EXIT_FAILED
    except OSError as error:
        output.say(f"{error.filename or ''}: {error.strerror or error}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
