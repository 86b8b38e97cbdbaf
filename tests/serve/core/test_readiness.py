"""Readiness: the core probes its backend at most once a second, one probe for every route and caller, and at
once again while the backend is still loading."""

import threading

import pytest


class _Backend:
    kind = "fake"
    loaded = True

    def __init__(self):
        self.ready_calls = 0
        self.fail = False

    def ready(self):
        from serve.core.errors import Unavailable

        self.ready_calls += 1
        if self.fail:
            raise Unavailable("the model went away")
        return 7

    def info(self):
        from serve.core import ModelInfo

        return ModelInfo(name="cifar10", version=7, versions=(7,), architecture="x", runtime="fake")

    def close(self):
        pass


def _service(backend, clock=lambda: 100.0):
    """The core over ``backend``, on a clock that stands still unless the test moves it."""
    from serve.core.service import InferenceService, Limits

    return InferenceService(backend, "cifar10", Limits(max_images=4, max_pixels=1 << 20, top_k=3, max_request_pixels=1 << 22),
                            clock=clock)


def test_readiness_probes_at_most_once_per_interval_on_a_fake_clock():
    from serve.core.errors import ServeError

    now = [100.0]
    backend = _Backend()
    readiness = _service(backend, clock=lambda: now[0])
    assert [readiness.ready() for _ in range(50)] == [7] * 50
    assert backend.ready_calls == 1
    backend.fail = True
    now[0] += 0.99
    assert readiness.ready() == 7 and backend.ready_calls == 1  # still the last result
    now[0] += 0.01
    with pytest.raises(ServeError, match="went away"):
        readiness.ready()
    with pytest.raises(ServeError):
        readiness.ready()
    assert backend.ready_calls == 2


def test_readyz_and_the_v2_health_routes_share_one_probe():
    from serve import create_app

    backend = _Backend()
    app = create_app({"MODEL_NAME": "cifar10"}, backend=backend)
    client = app.test_client()
    answers = [client.get(path).status_code for path in ["/readyz", "/v2/health/ready", "/v2/models/cifar10/ready"] * 30]
    assert answers == [200] * 90
    assert backend.ready_calls <= 2  # once, or twice if the test straddled a second


def test_concurrent_readyz_calls_run_one_probe():
    entered, release = threading.Event(), threading.Event()

    class Slow(_Backend):
        def ready(self):
            entered.set()
            release.wait(30)
            return super().ready()

    backend = Slow()
    readiness = _service(backend)
    results = []
    threads = [threading.Thread(target=lambda: results.append(readiness.ready())) for _ in range(8)]
    threads[0].start()
    assert entered.wait(30)
    for thread in threads[1:]:
        thread.start()
    release.set()
    for thread in threads:
        thread.join(30)
    assert results == [7] * 8 and backend.ready_calls == 1


def test_a_backend_still_loading_is_probed_again_at_once():
    """No model call is spent while loading, so that answer is not kept: ready the moment the model is in."""
    backend = _Backend()
    backend.loaded = False
    backend.fail = True
    readiness = _service(backend)
    with pytest.raises(Exception, match="went away"):
        readiness.ready()
    backend.loaded, backend.fail = True, False
    assert readiness.ready() == 7
