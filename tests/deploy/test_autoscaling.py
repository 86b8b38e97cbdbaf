"""Autoscaling on what matters (issue 43): the HPA's custom metrics are the server's own gauges, served by
prometheus-adapter's rules, and the gauges move with the load."""

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import yaml

import synthetic

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"


def _render(target):
    out = subprocess.run([str(KUBECTL), "kustomize", str(ROOT / "deploy" / "k8s" / target)], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    return [r for r in yaml.safe_load_all(out) if r]


def _gauges():
    from prometheus_client import CollectorRegistry

    from serve.telemetry.metrics import Metrics

    metrics = Metrics()
    return {m.name for m in metrics._registry.collect() if m.type == "gauge"}, metrics, CollectorRegistry


def test_every_custom_metric_of_the_hpa_is_a_server_gauge_an_adapter_rule_serves():
    (hpa,) = [r for r in _render("overlays/local") if r["kind"] == "HorizontalPodAutoscaler"]
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert wanted == {"serve_in_flight_requests", "serve_queue_images"}
    (config_map,) = [r for r in _render("monitoring") if r["kind"] == "ConfigMap"]
    rules = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    served = {rule["name"]["as"]: rule for rule in rules}
    assert wanted <= set(served)
    gauges, _, _ = _gauges()
    for name in wanted:
        assert name in gauges, f"{name} is no gauge of serve/metrics.py"
        assert served[name]["seriesQuery"].startswith(name + "{")  # the rule reads the gauge itself
        assert set(served[name]["resources"]["overrides"]) == {"namespace", "pod"}  # per pod, as type Pods asks


def _value(metrics, name):
    body, _ = metrics.exposition()
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed")


def test_the_in_flight_gauge_counts_requests_under_way(model_base):
    from serve import create_app

    app = create_app({"TESTING": True, "MODEL_DIR": str(model_base)})
    backend = app.extensions["serve.backend"]
    backend.wait_loaded()
    metrics = app.extensions["serve.metrics"]
    entered, release = threading.Event(), threading.Event()
    real = backend.infer

    def held(images, version=None, deadline=None):
        entered.set()
        assert release.wait(60)
        return real(images, version, deadline)

    backend.infer = held
    try:
        png = synthetic.encode(synthetic.make_images(1)[0][0])
        worker = threading.Thread(target=lambda: app.test_client().post("/api/v1/predict", **synthetic.multipart(("a.png", png))))
        worker.start()
        assert entered.wait(60)
        assert _value(metrics, "serve_in_flight_requests") == 1
        release.set()
        worker.join(60)
        assert _value(metrics, "serve_in_flight_requests") == 0
    finally:
        release.set()
        backend.close()


def test_the_queue_gauge_follows_the_images_a_worker_holds():
    """``serve_queue_images``: the images a worker's core holds (queued for, or in, a model call), what it sheds past."""
    from fake_backend import FakeBackend, make_app

    backend = FakeBackend()
    backend.hold = threading.Event()
    app = make_app(backend)
    metrics = app.extensions["serve.metrics"]
    pixels = {"instances": np.zeros((3, 32, 32, 3), np.uint8).tolist()}
    worker = threading.Thread(target=lambda: app.test_client().post("/v1/models/cifar10:predict", json=pixels))
    try:
        worker.start()
        assert backend.entered.wait(30)
        assert _value(metrics, "serve_queue_images") == 3
    finally:
        backend.hold.set()
        worker.join(30)
    assert _value(metrics, "serve_queue_images") == 0
