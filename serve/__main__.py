"""Start the server under gunicorn, or granian (``--server granian``); never Flask's development server.

Typical usage::

    python -m serve --model-dir models/cifar10 --host 127.0.0.1 --port 8000 --grpc-port 8500
    python -m serve --model-config-file models.config   # several versions and labels, as TF Serving's config
    python -m serve --backend tfserving-rest --tfserving-rest-url http://127.0.0.1:8501
    python -m serve --check        # print the effective settings and exit (2: a bad value, named)

Flags set the environment variables of :mod:`serve.settings` and then exec
``gunicorn -c python:serve.gunicorn_conf "serve:create_app()"``, the same command the
Docker image runs.
"""

import argparse
import os
import sys
import tempfile

from serve import settings

GUNICORN_ARGS = ["-c", "python:serve.gunicorn_conf", "serve:create_app()"]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", help="model directory holding version folders N/ (sets MODEL_DIR)")
    parser.add_argument("--model-name", help="model name in URLs (sets MODEL_NAME; default cifar10)")
    parser.add_argument("--model-config-file", help="TF Serving's model config file: the versions to serve and their "
                        "labels, re-read when it changes (sets SERVE_MODEL_CONFIG_FILE; default: the newest version)")
    parser.add_argument("--host", help="address to listen on (sets HOST; default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="port to listen on (sets PORT; default 8000)")
    parser.add_argument("--grpc-port", type=int, help="port of TF Serving's gRPC API, 0 for none (sets GRPC_PORT; default 8500)")
    parser.add_argument("--backend", choices=settings.BACKENDS, help="where predictions run (sets SERVE_BACKEND; default local)")
    parser.add_argument("--tfserving-rest-url", help="TF Serving REST URL, e.g. http://host:8501 (sets TFSERVING_REST_URL)")
    parser.add_argument("--tfserving-grpc-target", help="TF Serving gRPC host:port (sets TFSERVING_GRPC_TARGET)")
    parser.add_argument("--server", choices=settings.SERVERS, help="the HTTP server (sets SERVE_SERVER; default gunicorn)")
    parser.add_argument("--workers", type=int, help="worker processes (sets WEB_CONCURRENCY; default 2, 1 on one core)")
    parser.add_argument("--threads", type=int, help="threads per worker (sets GUNICORN_THREADS; default 16)")
    parser.add_argument("--check", action="store_true", help="print the settings the server would run with, and exit")
    args = parser.parse_args(argv)
    env = {
        "MODEL_DIR": args.model_dir and os.path.abspath(args.model_dir),
        "MODEL_NAME": args.model_name,
        "SERVE_MODEL_CONFIG_FILE": args.model_config_file and os.path.abspath(args.model_config_file),
        "HOST": args.host,
        "PORT": args.port and str(args.port),
        "GRPC_PORT": None if args.grpc_port is None else str(args.grpc_port),
        "SERVE_BACKEND": args.backend,
        "TFSERVING_REST_URL": args.tfserving_rest_url,
        "TFSERVING_GRPC_TARGET": args.tfserving_grpc_target,
        "SERVE_SERVER": args.server,
        "WEB_CONCURRENCY": args.workers and str(args.workers),
        "GUNICORN_THREADS": args.threads and str(args.threads),
    }
    os.environ.update({key: value for key, value in env.items() if value})
    try:
        configured = settings.Settings.from_env().resolved()
    except settings.SettingsError as e:
        print(f"serve: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(configured.describe())
        return 0
    # The savedmodel runtime's TensorFlow: warnings and errors only, and CPU devices alone (serving is on the
    # CPU), so it never calls cuInit and logs its failure as an error on a machine without a GPU.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLED_DEVICE_TYPES", "CPU")
    # glibc reads it when the exec'd process starts (serve/gunicorn_conf.py says why 2).
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    if configured.server == "granian":
        from serve import granian_conf

        # gunicorn's config makes this folder in its arbiter; granian has none, so it is made here, for every worker.
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="serve-prometheus-"))
        argv = [sys.executable, "-m", "granian", *granian_conf.command(configured)]
    else:
        argv = [sys.executable, "-m", "gunicorn", *GUNICORN_ARGS]
    # Safe: this interpreter with fixed arguments; no shell, and nothing from the user reaches argv.
    os.execv(sys.executable, argv)  # nosec B606


if __name__ == "__main__":
    sys.exit(main())
