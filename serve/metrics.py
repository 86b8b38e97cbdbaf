"""Prometheus metrics. Under gunicorn with several workers, prometheus-client's multiprocess
mode (``PROMETHEUS_MULTIPROC_DIR``, set by :mod:`serve.gunicorn_conf`) adds up every worker."""

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """This app's metrics, in its own registry (or in the shared multiprocess files)."""

    def __init__(self, multiprocess=False):
        # prometheus-client chose its value store at import from PROMETHEUS_MULTIPROC_DIR; the
        # settings say whether that variable is set, so that the scrape reads the same store.
        self.multiprocess = multiprocess
        # In multiprocess mode values live in files and are collected at scrape time, so the
        # metrics themselves are not registered anywhere.
        self._registry = None if self.multiprocess else CollectorRegistry()
        kw = {"registry": self._registry}
        self.latency = Histogram(
            "serve_request_duration_seconds", "Time to answer a request.", ["route", "method"], buckets=LATENCY_BUCKETS, **kw
        )
        self.requests = Counter("serve_requests", "Requests answered, by route and status.", ["route", "method", "status"], **kw)
        self.batch_size = Histogram("serve_batch_size", "Images per model call.", buckets=BATCH_BUCKETS, **kw)
        self.images = Counter("serve_images", "Images classified.", **kw)
        # 1 for the (runtime, version) each live worker serves; "livemax" forgets exited workers.
        self.model = Gauge(
            "serve_model", "The model version answering, by runtime (1: serving).", ["runtime", "version"],
            multiprocess_mode="livemax", **kw,
        )
        self._model_labels = None
        self.skipped = Gauge(
            "serve_model_version_skipped",
            "Versions newer than the one answering that this worker passed over (1: skipped; /readyz says why).",
            ["runtime", "version"], multiprocess_mode="livemax", **kw,
        )
        self.rejections = Counter(
            "serve_rejections",
            "Requests refused before a view ran (serve.security): missing_key, wrong_key, rate_limited; by area.",
            ["reason", "area"],
            **kw,
        )

    def model_loaded(self, runtime, version):
        """Record that ``version`` now answers in ``runtime`` (the previous one, if any, goes to 0)."""
        if self._model_labels is not None:
            self.model.labels(*self._model_labels).set(0)
        self._model_labels = (runtime, str(version))
        self.model.labels(*self._model_labels).set(1)

    def version_skipped(self, runtime, version, reason):
        """Record that ``version`` was passed over in ``runtime`` (``reason`` is logged and shown by /readyz)."""
        self.skipped.labels(runtime, str(version)).set(1)

    def exposition(self):
        """``(body, content type)`` for ``GET /metrics``."""
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        else:
            registry = self._registry
        return generate_latest(registry), CONTENT_TYPE_LATEST
