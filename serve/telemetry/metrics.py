"""Prometheus metrics. Under gunicorn with several workers, prometheus-client's multiprocess
mode (``PROMETHEUS_MULTIPROC_DIR``, set by :mod:`serve.gunicorn_conf`) adds up every worker."""

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from contract import OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES

#: The HTTP methods counted by name; any other is counted as "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: The top class's probability: fine steps near 1, where a confident model's answers sit.
TOP_PROBABILITY_BUCKETS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.999, 1.0)
#: The out-of-distribution score (the energy of the logits, contract.confidence): in-distribution
#: images sit lower than foreign ones; where depends on the model (its threshold is in its manifest).
OOD_SCORE_BUCKETS = (-50, -40, -30, -25, -20, -17.5, -15, -12.5, -10, -8, -6, -4, -2, 0, 5)


class _Children(dict):
    """Children of labelled metrics by their label values, made by ``make(key)`` on the first miss and kept.

    ``labels()`` checks and converts its values on every call; a hit here is one dict lookup (``__missing__``
    runs only on a miss), so the per-request paths cost no more than that. Label values come from small
    fixed sets (routes, methods, statuses, model versions), so the cache stays small.
    """

    __slots__ = ("_make",)

    def __init__(self, make):
        super().__init__()
        self._make = make

    def __missing__(self, key):
        children = self[key] = self._make(key)
        return children


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
        # gRPC calls (serve/grpc/interceptors.py): the method is one the server registered (an unknown one never
        # reaches the interceptor), the code one of gRPC's status names: both from fixed sets.
        self.grpc_latency = Histogram(
            "serve_grpc_request_duration_seconds", "Time to answer a gRPC call, by method.", ["method"],
            buckets=LATENCY_BUCKETS, **kw,
        )
        self.grpc_requests = Counter("serve_grpc_requests", "gRPC calls answered, by method and status code.",
                                     ["method", "code"], **kw)
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
        # What an autoscaler scales on (deploy/k8s/base/hpa.yaml, through prometheus-adapter): summed over
        # the live workers of a pod.
        self.in_flight = Gauge("serve_in_flight_requests", "HTTP requests being answered now.",
                               multiprocess_mode="livesum", **kw)
        self.queued = Gauge("serve_queue_images", "Images waiting for (or in) a model call of the local backend now.",
                            multiprocess_mode="livesum", **kw)
        self.shed = Counter(
            "serve_shed", "Requests answered 503 with Retry-After because the worker was full: queue_full (SERVE_MAX_QUEUE) "
            "or timeout (SERVE_PREDICT_TIMEOUT_S).", ["reason"], **kw,
        )
        self.rejections = Counter(
            "serve_rejections",
            "Requests refused before a view ran (serve.security): missing_key, wrong_key, rate_limited; by area.",
            ["reason", "area"],
            **kw,
        )
        # Children of the labelled metrics each request and each model call observe, by their label values.
        self._request_children = _Children(self._request_children_of)
        self._answer_children = _Children(self._answer_children_of)

        # What the answers say about the images sent (drift): per model version, on every route.
        self.top_probability = Histogram(
            "serve_top_probability", "The top class's probability of each image answered, by model version.",
            ["version"], buckets=TOP_PROBABILITY_BUCKETS, **kw,
        )
        self.ood_score = Histogram(
            "serve_ood_score", "The out-of-distribution score of each image answered (higher: more foreign), by model version.",
            ["version"], buckets=OOD_SCORE_BUCKETS, **kw,
        )
        self.out_of_distribution = Counter(
            "serve_out_of_distribution_answers",
            "Images answered in_distribution: false (over the model's threshold), by model version.", ["version"], **kw,
        )

    def request_answered(self, route, method, status, seconds):
        """Observe one HTTP answer: its duration in seconds (None: not timed) and its count, by route, method and status.

        ``route`` and ``method`` come from fixed sets (the app's rules, :data:`METHODS`), so the children are
        looked up once for each combination and kept (:class:`_Children`).
        """
        children = self._request_children[(route, method, status)]
        if seconds is not None:
            children[0].observe(seconds)
        children[1].inc()

    def _request_children_of(self, key):
        route, method, status = key
        return self.latency.labels(route, method), self.requests.labels(route, method, str(status))

    def answers(self, version, outputs):
        """Observe one model call's answers (numpy arrays, as backends answer): every image's top probability, score
        and verdict."""
        top, score, foreign_count = self._answer_children[version]  # a server answers with a few versions
        probabilities = outputs[OUTPUT_PROBABILITIES]
        for p in probabilities.max(axis=1).tolist():
            top.observe(p)
        scores = outputs.get(OUTPUT_OOD_SCORE)
        if scores is not None:
            for value in scores.tolist():
                score.observe(value)
        inside = outputs.get(OUTPUT_IN_DISTRIBUTION)
        if inside is not None:
            foreign = len(inside) - np.count_nonzero(inside)
            if foreign:
                foreign_count.inc(foreign)

    def _answer_children_of(self, version):
        label = str(version)
        return self.top_probability.labels(label), self.ood_score.labels(label), self.out_of_distribution.labels(label)

    def model_loaded(self, runtime, version):
        """Record that ``version`` now answers in ``runtime`` (the previous one, if any, goes to 0)."""
        if self._model_labels is not None:
            self.model.labels(*self._model_labels).set(0)
        self._model_labels = (runtime, str(version))
        self.model.labels(*self._model_labels).set(1)

    def version_skipped(self, runtime, version, reason):
        """Record that ``version`` was passed over in ``runtime`` (``reason`` is logged and shown by /readyz)."""
        self.skipped.labels(runtime, str(version)).set(1)

    def versions_served(self):
        """The model versions that live workers answer with now (serve_model at 1), ascending.

        Under gunicorn every worker polls for new versions on its own, so for a moment during a
        swap, or for good when one worker cannot load a version the others did, they differ.
        """
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        else:
            registry = self._registry
        versions = set()
        for metric in registry.collect():
            if metric.name == "serve_model":
                versions.update(int(s.labels["version"]) for s in metric.samples if s.value == 1 and s.labels.get("version"))
        return sorted(versions)

    def exposition(self):
        """``(body, content type)`` for ``GET /metrics``."""
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        else:
            registry = self._registry
        return generate_latest(registry), CONTENT_TYPE_LATEST
