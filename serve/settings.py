"""The server's configuration: every environment variable it reads, parsed and checked in one place.

The variables, their defaults and what each does are listed in the configuration and security
tables of ``serve/README.md`` (``tests/serve/test_settings_docs.py`` keeps that list and :class:`Settings`
in step). :meth:`Settings.from_env` reads them all at once and refuses a bad value with one line
naming the variable; :meth:`Settings.resolved` then reads the files they name (the model config, a TF Serving
backend's manifest), so that a file that would break a request later stops the start instead. A process
reads them once (:func:`process`: gunicorn's arbiter, whose workers inherit them, and ``python -m serve``)
and hands them down: ``create_app``, the logs, the gate, the backend and the core each take them.

Typical usage::

    python -m serve --check        # the effective settings, or the first bad one (exit 2)
"""

import dataclasses
import functools
import os
import re

from contract import DEFAULT_MODEL_NAME, DEFAULT_SERVING_RUNTIME, SERVING_RUNTIMES

DEFAULT_MODEL_BASE_PATH = "/models"
DEFAULT_BACKEND = "local"
DEFAULT_RUNTIME = DEFAULT_SERVING_RUNTIME  # why: serve.backends.runtimes
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_TFSERVING_MAX_BATCH = 128  # deploy/batching.config's max_batch_size
DEFAULT_MODEL_POLL_S = 30.0
DEFAULT_MODEL_CONFIG_POLL_S = 30.0  # TF Serving's --model_config_file_poll_wait_seconds defaults to 0 (read once)
DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_IMAGES = 256
DEFAULT_BATCH_WAIT_MS = 2.0
DEFAULT_MAX_UPLOAD_MB = 16.0
DEFAULT_MAX_PIXELS = 4096 * 4096
DEFAULT_TOP_K = 3
DEFAULT_MAX_REQUEST_PIXELS = 4 * DEFAULT_MAX_PIXELS  # four images at the per-image cap
DEFAULT_MAX_QUEUE = 1024  # images waiting for the model in one worker
DEFAULT_PREDICT_TIMEOUT_S = 30.0
DEFAULT_GRPC_PORT = 8500  # TF Serving's gRPC port
BACKENDS = ("local", "tfserving-rest", "tfserving-grpc")
SERVERS = ("gunicorn", "granian")
RUNTIMES = SERVING_RUNTIMES
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("json", "text")
#: What ``OTEL_TRACES_EXPORTER`` may name (a comma-separated list): serve.tracing builds each.
TRACES_EXPORTERS = ("otlp", "console", "none")
#: The OTLP transports the server ships an exporter for (opentelemetry-exporter-otlp-proto-http).
OTLP_PROTOCOLS = ("http/protobuf",)
DEFAULT_RATE_LIMIT_STORE = "memory://"
#: The storage schemes the ``limits`` package accepts.
RATE_LIMIT_STORES = ("memory", "redis", "rediss", "redis+unix", "redis+sentinel", "redis+cluster", "memcached", "mongodb", "valkey")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A variable with a value the server cannot run with; the message names it."""


# -- parsers: a string from the environment (or a typed value from a test's config) to a value ----
def _text(value):
    return str(value)


def _name(value):
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", str(value)):
        raise ValueError("must be letters, digits, '.', '_' or '-' (it is part of every URL)")
    return str(value)


def _integer(low, high=None):
    def parse(value):
        if isinstance(value, bool):
            raise ValueError("must be a whole number")
        try:
            number = int(value) if isinstance(value, int) else int(str(value).strip())
        except ValueError:
            raise ValueError("must be a whole number") from None
        _check_range(number, low, high)
        return number

    return parse


def _number(low, high=None, above=None):
    def parse(value):
        if isinstance(value, bool):
            raise ValueError("must be a number")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError("must be a number") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError("must be a finite number")
        if above is not None and number <= above:
            raise ValueError(f"must be more than {above:g}")
        _check_range(number, low, high)
        return number

    return parse


def _check_range(number, low, high):
    if low is not None and number < low:
        raise ValueError(f"must be at least {low:g}")
    if high is not None and number > high:
        raise ValueError(f"must be at most {high:g}")


def _choice(*choices):
    def parse(value):
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def _boolean(value):
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"must be one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")


def _rate_limit(value):
    from limits import parse_many

    text = str(value)
    try:
        parse_many(text)
    except ValueError:
        raise ValueError("is not a rate limit (e.g. '10/second;300/minute')") from None
    return text


def _rate_limit_store(value):
    scheme = str(value).partition("://")[0]
    if "://" not in str(value) or scheme not in RATE_LIMIT_STORES:
        raise ValueError(f"must be a storage URI such as memory:// or redis://HOST:PORT/DB (schemes: {', '.join(RATE_LIMIT_STORES)})")
    return str(value)


def _exporters(value):
    names = [name.strip() for name in str(value).split(",") if name.strip()]
    unknown = [name for name in names if name not in TRACES_EXPORTERS]
    if unknown or not names:
        raise ValueError(f"must be one or more of {', '.join(TRACES_EXPORTERS)}, comma-separated")
    if "none" in names and len(set(names)) > 1:
        raise ValueError("'none' cannot be listed with an exporter")
    return ",".join(dict.fromkeys(names))


def _url(value):
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", str(value)):
        raise ValueError("must be an http:// or https:// URL")
    return str(value)


def _origins(value):
    items = value.split(",") if isinstance(value, str) else list(value or ())
    origins = [item.strip() for item in items if item and item.strip()]
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^\s/]+", origin):
            raise ValueError(f"{origin!r} is not an origin such as https://app.example (scheme and host, no path)")
    return ",".join(origins)


def _var(env, parse, default, key=None):
    """A setting read from the variable ``env`` with ``parse``; ``key`` is its Flask config key (default: the field's name in capitals)."""
    return dataclasses.field(default=default, metadata={"env": env, "parse": parse, "key": key})


def _cores():
    return len(os.sched_getaffinity(0))


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every variable the server reads, typed; ``None`` where unset and optional."""

    # The model and where predictions run.
    model_name: str = _var("MODEL_NAME", _name, DEFAULT_MODEL_NAME)
    model_base_path: str = _var("MODEL_BASE_PATH", _text, DEFAULT_MODEL_BASE_PATH)
    model_dir: str = _var("MODEL_DIR", _text, None)  # None: MODEL_BASE_PATH/MODEL_NAME
    backend: str = _var("SERVE_BACKEND", _choice(*BACKENDS), DEFAULT_BACKEND)
    runtime: str = _var("SERVE_RUNTIME", _choice(*RUNTIMES), DEFAULT_RUNTIME)
    runtime_threads: int = _var("SERVE_RUNTIME_THREADS", _integer(0, 1024), 0)
    tfserving_rest_url: str = _var("TFSERVING_REST_URL", _url, None)
    tfserving_grpc_target: str = _var("TFSERVING_GRPC_TARGET", _text, None)
    tfserving_timeout_s: float = _var("TFSERVING_TIMEOUT_S", _number(None, 3600, above=0), DEFAULT_TIMEOUT_S)
    tfserving_max_batch: int = _var("TFSERVING_MAX_BATCH", _integer(0, 65536), DEFAULT_TFSERVING_MAX_BATCH)
    model_poll_s: float = _var("MODEL_POLL_S", _number(0, 86400), DEFAULT_MODEL_POLL_S)
    # TF Serving's model config file (serve.model_config): versions, labels; it names the model and its path.
    model_config_file: str = _var("SERVE_MODEL_CONFIG_FILE", _text, None)
    model_config_poll_s: float = _var("SERVE_MODEL_CONFIG_POLL_S", _number(0, 86400), DEFAULT_MODEL_CONFIG_POLL_S)
    # What one request may ask for.
    max_batch: int = _var("SERVE_MAX_BATCH", _integer(1, 4096), DEFAULT_MAX_BATCH)
    max_images: int = _var("SERVE_MAX_IMAGES", _integer(1, 65536), DEFAULT_MAX_IMAGES)
    batch_wait_ms: float = _var("SERVE_BATCH_WAIT_MS", _number(0, 1000), DEFAULT_BATCH_WAIT_MS)
    max_upload_mb: float = _var("SERVE_MAX_UPLOAD_MB", _number(None, 1024, above=0), DEFAULT_MAX_UPLOAD_MB)
    max_pixels: int = _var("SERVE_MAX_PIXELS", _integer(1, 1 << 31), DEFAULT_MAX_PIXELS)
    max_request_pixels: int = _var("SERVE_MAX_REQUEST_PIXELS", _integer(1, 1 << 40), DEFAULT_MAX_REQUEST_PIXELS)
    decode_concurrency: int = _var("SERVE_DECODE_CONCURRENCY", _integer(0, 1024), 0)  # 0: one a core
    max_queue: int = _var("SERVE_MAX_QUEUE", _integer(1, 1 << 20), DEFAULT_MAX_QUEUE)
    predict_timeout_s: float = _var("SERVE_PREDICT_TIMEOUT_S", _number(None, 3600, above=0), DEFAULT_PREDICT_TIMEOUT_S)
    top_k: int = _var("SERVE_TOP_K", _integer(1, 1000), DEFAULT_TOP_K)
    # serve.security: keys, rate limits, CORS, proxies (everything off unless set).
    api_keys: str = _var("SERVE_API_KEYS", _text, "")
    api_key_file: str = _var("SERVE_API_KEY_FILE", _text, None)
    form_needs_key: bool = _var("SERVE_FORM_NEEDS_KEY", _boolean, True)
    metrics_keys: str = _var("SERVE_METRICS_KEYS", _text, "")
    metrics_key_file: str = _var("SERVE_METRICS_KEY_FILE", _text, None)
    rate_limit: str = _var("SERVE_RATE_LIMIT", _rate_limit, "")
    rate_limit_api: str = _var("SERVE_RATE_LIMIT_API", _rate_limit, "")
    rate_limit_form: str = _var("SERVE_RATE_LIMIT_FORM", _rate_limit, "")
    rate_limit_open: str = _var("SERVE_RATE_LIMIT_OPEN", _rate_limit, "")
    rate_limit_store: str = _var("SERVE_RATE_LIMIT_STORE", _rate_limit_store, DEFAULT_RATE_LIMIT_STORE)
    cors_origins: str = _var("SERVE_CORS_ORIGINS", _origins, "")
    trusted_proxies: int = _var("SERVE_TRUSTED_PROXIES", _integer(0, 16), 0)
    # The HTTP server (gunicorn: serve/gunicorn_conf.py; granian: serve/granian_conf.py) and its worker processes.
    server: str = _var("SERVE_SERVER", _choice(*SERVERS), "gunicorn")
    host: str = _var("HOST", _text, "0.0.0.0")  # nosec B104  # the container's default; HOST narrows it
    port: int = _var("PORT", _integer(1, 65535), 8000)
    grpc_port: int = _var("GRPC_PORT", _integer(0, 65535), DEFAULT_GRPC_PORT)  # 0: no gRPC
    web_concurrency: int = _var("WEB_CONCURRENCY", _integer(1, 256), None)  # None: min(2, cores)
    gunicorn_threads: int = _var("GUNICORN_THREADS", _integer(1, 1024), 16)
    gunicorn_timeout: int = _var("GUNICORN_TIMEOUT", _integer(0, 86400), 120)
    gunicorn_accesslog: str = _var("GUNICORN_ACCESSLOG", _text, None)
    gunicorn_loglevel: str = _var("GUNICORN_LOGLEVEL", _choice(*LOG_LEVELS), "info")
    log_format: str = _var("SERVE_LOG_FORMAT", _choice(*LOG_FORMATS), "json")
    malloc_arena_max: int = _var("MALLOC_ARENA_MAX", _integer(1, 1024), None)
    prometheus_multiproc_dir: str = _var("PROMETHEUS_MULTIPROC_DIR", _text, None)
    # OpenTelemetry traces (serve.tracing); the SDK and its exporter read their own OTEL_* variables too.
    traces_exporter: str = _var("OTEL_TRACES_EXPORTER", _exporters, "none")
    service_name: str = _var("OTEL_SERVICE_NAME", _text, None)  # None: the SDK's resource, else "serve"
    # Only OTLP over HTTP is installed: asking for gRPC is refused here, not sent over HTTP unannounced.
    otlp_protocol: str = _var("OTEL_EXPORTER_OTLP_PROTOCOL", _choice(*OTLP_PROTOCOLS), None)
    otlp_traces_protocol: str = _var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", _choice(*OTLP_PROTOCOLS), None)

    def __post_init__(self):
        if self.model_dir is None:
            object.__setattr__(self, "model_dir", os.path.join(self.model_base_path, self.model_name))
        if self.web_concurrency is None:
            object.__setattr__(self, "web_concurrency", min(2, _cores()))
        for backend, field in (("tfserving-rest", "tfserving_rest_url"), ("tfserving-grpc", "tfserving_grpc_target")):
            if self.backend == backend and not getattr(self, field):
                raise SettingsError(f"SERVE_BACKEND={backend} needs {_env(field)}")
        if self.grpc_port == self.port:
            raise SettingsError(f"GRPC_PORT={self.grpc_port}: must differ from PORT (HTTP), or be 0 for no gRPC")
        if self.model_config_file is not None and self.backend != "local":
            raise SettingsError(f"SERVE_MODEL_CONFIG_FILE is read by the local backend only (SERVE_BACKEND={self.backend}: "
                                "give the config file to that TF Serving)")

    def resolved(self):
        """These settings once the files they name are read: the model's name and path from the model config file
        (once it reads and its labels name published versions), and a TF Serving backend's manifest checked.
        A file that cannot serve stops the start here, in one line naming its variable."""
        settings = self
        if self.model_config_file is not None:
            from serve.backends import model_config

            try:
                config = model_config.check_published(model_config.read(self.model_config_file))
            except model_config.ConfigError as e:
                raise SettingsError(f"SERVE_MODEL_CONFIG_FILE={self.model_config_file!r}: {e}") from None
            settings = dataclasses.replace(self, model_name=config.name, model_dir=config.base_path)
        if self.backend != "local":
            settings._check_published_manifest()
        return settings

    def _check_published_manifest(self):
        """A TF Serving backend describes the model with the newest version's manifest under ``MODEL_DIR``, when there
        is one: one it cannot read (an older format among them) stops the start here, in one line with the fix."""
        from contract.manifest import ManifestError
        from serve.backends import published

        available = published.versions(self.model_dir)
        if available:
            try:
                published.manifest(os.path.join(self.model_dir, str(available[-1])))
            except ManifestError as e:
                raise SettingsError(f"{_env('model_dir')}={self.model_dir!r}: {e}") from None

    @classmethod
    def variables(cls):
        """The name of every environment variable a setting comes from."""
        return tuple(f.metadata["env"] for f in dataclasses.fields(cls))

    @classmethod
    def from_env(cls, environ=None, overrides=None):
        """The settings from ``environ`` (default ``os.environ``), then ``overrides`` by Flask config key.

        An empty variable counts as unset. Raises :class:`SettingsError` naming the first bad value.
        """
        env = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        if "MAX_UPLOAD_MB" not in overrides and "MAX_CONTENT_LENGTH" in overrides:  # Flask's own key, in bytes
            overrides["MAX_UPLOAD_MB"] = overrides["MAX_CONTENT_LENGTH"] / 1048576
        values = {}
        for f in dataclasses.fields(cls):
            name, key = f.metadata["env"], _key(f)
            if key in overrides:
                raw, source = overrides[key], key
            else:
                raw, source = env.get(name), name
            if raw is None or raw == "":
                continue
            try:
                values[f.name] = f.metadata["parse"](raw)
            except ValueError as e:
                raise SettingsError(f"{source}={raw!r}: {e}") from None
        return cls(**values)

    @property
    def max_upload_bytes(self):
        """``SERVE_MAX_UPLOAD_MB`` in bytes: Flask's ``MAX_CONTENT_LENGTH``."""
        return int(self.max_upload_mb * 1024 * 1024)

    def limits(self):
        """What one request may ask of this worker, for :class:`serve.core.service.InferenceService`."""
        from serve.core.service import Limits

        return Limits(max_images=self.max_images, max_pixels=self.max_pixels, top_k=self.top_k,
                      max_request_pixels=self.max_request_pixels, max_tensor_bytes=self.max_upload_bytes,
                      decode_concurrency=self.decode_concurrency or _cores(), max_queue=self.max_queue,
                      timeout_s=self.predict_timeout_s)

    @classmethod
    def keys(cls):
        """The override key of every setting (its field name in capitals): what ``from_env(overrides=...)`` takes."""
        return {_key(f) for f in dataclasses.fields(cls)}

    def describe(self):
        """``NAME=value`` lines for ``python -m serve --check``; keys are counted, never shown."""
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("api_keys", "metrics_keys"):
                value = f"({len([k for k in value.split(',') if k.strip()])} keys)" if value else ""
            lines.append(f"{f.metadata['env']}={'' if value is None else value}")
        return "\n".join(lines)


def _key(field):
    return field.metadata["key"] or field.name.upper()


def _env(name):
    return next(f.metadata["env"] for f in dataclasses.fields(Settings) if f.name == name)


@functools.cache
def process():
    """This process's settings, read from its environment and resolved once (:meth:`Settings.resolved`).

    gunicorn's arbiter reads them in ``serve/gunicorn_conf.py``; its workers, forked from it, find them here
    and never read the environment again. Raises :class:`SettingsError` naming the first bad value.
    """
    return Settings.from_env().resolved()
