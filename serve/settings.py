"""Server configuration from environment variables, named as in TF Serving's image.

==========================  =========================  ===============================================
variable                    default                    meaning
==========================  =========================  ===============================================
``MODEL_NAME``              ``cifar10``                the model's name in URLs and in TF Serving
``MODEL_BASE_PATH``         ``/models``                the model directory is BASE/NAME/ (holds N/)
``MODEL_DIR``               (BASE/NAME)                the model directory in full; overrides both
``SERVE_BACKEND``           ``local``                  ``local``, ``tfserving-rest``, ``tfserving-grpc``
``SERVE_RUNTIME``           ``litert``                 what runs the model in the local backend:
                                                       ``litert``, ``litert-int8``, ``savedmodel``
                                                       (serve.runtimes says why litert is the default)
``SERVE_RUNTIME_THREADS``   (cores / workers)          threads for one LiteRT model call
``TFSERVING_REST_URL``      (none)                     e.g. ``http://tfserving:8501``
``TFSERVING_GRPC_TARGET``   (none)                     e.g. ``tfserving:8500``
``TFSERVING_TIMEOUT_S``     ``5``                      seconds before TF Serving counts as down (503)
``TFSERVING_MAX_BATCH``     ``128``                    most rows in one call to TF Serving; larger
                                                       requests go as several (its max_batch_size;
                                                       0: never split)
``MODEL_POLL_S``            ``30``                     how often the local backend looks for a new
                                                       version N+1/ and switches to it (0: never)
``SERVE_MAX_BATCH``         ``32``                     most images in one model call (local backend)
``SERVE_BATCH_WAIT_MS``     ``2``                      most a busy batcher waits to fill a batch, ms
``SERVE_MAX_UPLOAD_MB``     ``16``                     largest request body, MiB (413 above it)
``SERVE_MAX_PIXELS``        ``16777216``               most pixels one image may declare (413)
``SERVE_TOP_K``             ``3``                      labels per image unless ``top_k`` is given
``SERVE_API_KEYS``          (none: keys off)           API keys, comma-separated: with any set, routes
                                                       under /api/, /v1/, /v2/ need one (serve.security)
``SERVE_API_KEY_FILE``      (none)                     a file of API keys, one a line (``#`` comments);
                                                       keeps them out of process listings
``SERVE_FORM_NEEDS_KEY``    ``1``                      with keys on, the form ``/`` needs one too (0: open)
``SERVE_METRICS_KEYS``      (none: open)               keys for ``/metrics`` alone, comma-separated
``SERVE_METRICS_KEY_FILE``  (none)                     the same, from a file
``SERVE_RATE_LIMIT``        (none: no limits)          each client's limit on each route, e.g.
                                                       ``20/second;600/minute`` (Flask-Limiter syntax)
``SERVE_RATE_LIMIT_API``    (``SERVE_RATE_LIMIT``)     the same, for routes under /api/, /v1/, /v2/
``SERVE_RATE_LIMIT_FORM``   (``SERVE_RATE_LIMIT``)     the same, for the form ``/``
``SERVE_RATE_LIMIT_STORE``  ``memory://``              where counts live: memory (per worker) or
                                                       ``redis://HOST:PORT/DB`` (shared)
``SERVE_CORS_ORIGINS``      (none: CORS off)           origins whose pages may call the API,
                                                       comma-separated, e.g. ``https://app.example``
``SERVE_TRUSTED_PROXIES``   ``0``                      proxies in front whose X-Forwarded-For, -Proto
                                                       and -Host are believed (werkzeug's ProxyFix)
``HOST`` / ``PORT``         ``0.0.0.0`` / ``8000``     where gunicorn listens
``WEB_CONCURRENCY``         ``2``                      gunicorn worker processes (1 on one core)
``GUNICORN_THREADS``        ``16``                     threads per worker
==========================  =========================  ===============================================

With ``tfserving-*`` backends ``MODEL_DIR`` is optional: when the files are there the
server reads the training manifest (architecture, all class names) from them.
"""

import os

from contract import DEFAULT_MODEL_NAME

DEFAULT_MODEL_BASE_PATH = "/models"
DEFAULT_BACKEND = "local"
DEFAULT_RUNTIME = "litert"  # why: serve.runtimes
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_TFSERVING_MAX_BATCH = 128  # deploy/batching.config's max_batch_size
DEFAULT_MODEL_POLL_S = 30.0
DEFAULT_MAX_BATCH = 32
DEFAULT_BATCH_WAIT_MS = 2.0
DEFAULT_MAX_UPLOAD_MB = 16
DEFAULT_MAX_PIXELS = 4096 * 4096
DEFAULT_TOP_K = 3
BACKENDS = ("local", "tfserving-rest", "tfserving-grpc")
DEFAULT_RATE_LIMIT_STORE = "memory://"
FALSE_WORDS = ("0", "false", "no", "off")


def from_environ(environ=None):
    """Flask config keys from the environment variables above."""
    env = os.environ if environ is None else environ
    name = env.get("MODEL_NAME") or DEFAULT_MODEL_NAME
    model_dir = env.get("MODEL_DIR") or os.path.join(env.get("MODEL_BASE_PATH") or DEFAULT_MODEL_BASE_PATH, name)
    max_upload_mb = float(env.get("SERVE_MAX_UPLOAD_MB") or DEFAULT_MAX_UPLOAD_MB)
    return {
        "MODEL_NAME": name,
        "MODEL_DIR": model_dir,
        "BACKEND": env.get("SERVE_BACKEND") or DEFAULT_BACKEND,
        "RUNTIME": env.get("SERVE_RUNTIME") or DEFAULT_RUNTIME,
        "RUNTIME_THREADS": int(env.get("SERVE_RUNTIME_THREADS") or 0),
        "TFSERVING_REST_URL": env.get("TFSERVING_REST_URL"),
        "TFSERVING_GRPC_TARGET": env.get("TFSERVING_GRPC_TARGET"),
        "TFSERVING_TIMEOUT_S": float(env.get("TFSERVING_TIMEOUT_S") or DEFAULT_TIMEOUT_S),
        "TFSERVING_MAX_BATCH": int(env.get("TFSERVING_MAX_BATCH") or DEFAULT_TFSERVING_MAX_BATCH),
        "MODEL_POLL_S": float(env.get("MODEL_POLL_S") or DEFAULT_MODEL_POLL_S),
        "MAX_BATCH": int(env.get("SERVE_MAX_BATCH") or DEFAULT_MAX_BATCH),
        "BATCH_WAIT_MS": float(env.get("SERVE_BATCH_WAIT_MS") or DEFAULT_BATCH_WAIT_MS),
        "MAX_CONTENT_LENGTH": int(max_upload_mb * 1024 * 1024),
        "MAX_PIXELS": int(env.get("SERVE_MAX_PIXELS") or DEFAULT_MAX_PIXELS),
        "TOP_K": int(env.get("SERVE_TOP_K") or DEFAULT_TOP_K),
        # serve.security: keys, rate limits, CORS, proxies (everything off unless set)
        "API_KEYS": env.get("SERVE_API_KEYS") or "",
        "API_KEY_FILE": env.get("SERVE_API_KEY_FILE") or None,
        "FORM_NEEDS_KEY": (env.get("SERVE_FORM_NEEDS_KEY") or "1").strip().lower() not in FALSE_WORDS,
        "METRICS_KEYS": env.get("SERVE_METRICS_KEYS") or "",
        "METRICS_KEY_FILE": env.get("SERVE_METRICS_KEY_FILE") or None,
        "RATE_LIMIT": env.get("SERVE_RATE_LIMIT") or "",
        "RATE_LIMIT_API": env.get("SERVE_RATE_LIMIT_API") or "",
        "RATE_LIMIT_FORM": env.get("SERVE_RATE_LIMIT_FORM") or "",
        "RATE_LIMIT_STORE": env.get("SERVE_RATE_LIMIT_STORE") or DEFAULT_RATE_LIMIT_STORE,
        "CORS_ORIGINS": env.get("SERVE_CORS_ORIGINS") or "",
        "TRUSTED_PROXIES": int(env.get("SERVE_TRUSTED_PROXIES") or 0),
    }
