"""Server configuration from environment variables, named as in TF Serving's image.

The variables, their defaults and what each does are listed in one place: the configuration
and security tables of ``serve/README.md`` (``tests/test_settings_docs.py`` keeps them in step
with this module).
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
    """Flask config keys from the environment variables (serve/README.md lists them)."""
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
