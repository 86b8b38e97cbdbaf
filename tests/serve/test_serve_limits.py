"""The server's guards that are not about bodies: checked settings, the readiness probe's rate, the
batcher's largest call, and /metrics behind the keys."""

import subprocess
import sys
import threading

import numpy as np
import pytest

from live_server import free_port

# -- settings: one typed object, checked at start -----------------------------------------------

BAD = [
    ({"SERVE_TOP_K": "0"}, "SERVE_TOP_K='0': must be at least 1"),
    ({"SERVE_TOP_K": "three"}, "SERVE_TOP_K='three': must be a whole number"),
    ({"SERVE_MAX_IMAGES": "-5"}, "SERVE_MAX_IMAGES='-5': must be at least 1"),
    ({"SERVE_MAX_BATCH": "0"}, "SERVE_MAX_BATCH='0': must be at least 1"),
    ({"SERVE_MAX_UPLOAD_MB": "0"}, "SERVE_MAX_UPLOAD_MB='0': must be more than 0"),
    ({"SERVE_BATCH_WAIT_MS": "nan"}, "SERVE_BATCH_WAIT_MS='nan': must be a finite number"),
    ({"SERVE_RUNTIME": "onnx"}, "SERVE_RUNTIME='onnx': must be one of litert, litert-int8, savedmodel"),
    ({"SERVE_BACKEND": "tfserving-rest"}, "SERVE_BACKEND=tfserving-rest needs TFSERVING_REST_URL"),
    ({"TFSERVING_REST_URL": "tfserving:8501"}, "TFSERVING_REST_URL='tfserving:8501': must be an http:// or https:// URL"),
    ({"SERVE_FORM_NEEDS_KEY": "maybe"}, "SERVE_FORM_NEEDS_KEY='maybe': must be one of"),
    ({"SERVE_RATE_LIMIT_API": "lots"}, "SERVE_RATE_LIMIT_API='lots': is not a rate limit"),
    ({"SERVE_RATE_LIMIT_STORE": "postgres://db"}, "SERVE_RATE_LIMIT_STORE='postgres://db': must be a storage URI"),
    ({"SERVE_CORS_ORIGINS": "https://a.example/path"}, "is not an origin"),
    ({"MODEL_NAME": "a/b"}, "MODEL_NAME='a/b': must be letters"),
    ({"PORT": "70000"}, "PORT='70000': must be at most 65535"),
    ({"WEB_CONCURRENCY": "0"}, "WEB_CONCURRENCY='0': must be at least 1"),
    ({"GUNICORN_LOGLEVEL": "loud"}, "GUNICORN_LOGLEVEL='loud': must be one of debug"),
    ({"MALLOC_ARENA_MAX": "x"}, "MALLOC_ARENA_MAX='x': must be a whole number"),
]


@pytest.mark.parametrize("env, message", BAD, ids=[next(iter(env)) + "=" + next(iter(env.values())) for env, _ in BAD])
def test_a_bad_value_is_refused_naming_its_variable(env, message):
    from serve.settings import Settings, SettingsError

    with pytest.raises(SettingsError) as refused:
        Settings.from_env(env)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_settings_are_typed_and_defaults_fill_the_rest():
    from serve.settings import Settings

    settings = Settings.from_env({"SERVE_TOP_K": " 5 ", "SERVE_FORM_NEEDS_KEY": "off", "MODEL_BASE_PATH": "/srv", "SERVE_MAX_IMAGES": ""})
    assert settings.top_k == 5 and settings.form_needs_key is False and settings.max_images == 256
    assert settings.model_dir == "/srv/cifar10"
    assert settings.max_upload_bytes == 16 * 1024 * 1024
    limits = settings.limits()
    assert (limits.top_k, limits.max_images, limits.max_pixels) == (5, 256, 4096 * 4096)


def test_create_app_checks_its_config_overrides_too():
    from serve import create_app
    from serve.settings import SettingsError

    with pytest.raises(SettingsError, match="TOP_K=0: must be at least 1"):
        create_app({"MODEL_NAME": "cifar10", "TOP_K": 0}, backend=_Backend())


def _run(args, env):
    import os

    return subprocess.run([sys.executable, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


def test_python_m_serve_check_prints_the_settings_and_hides_the_keys():
    done = _run(["-m", "serve", "--check"], {"SERVE_API_KEYS": "secret-one,secret-two", "SERVE_TOP_K": "4"})
    assert done.returncode == 0, done.stderr
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert lines["SERVE_TOP_K"] == "4" and lines["SERVE_MAX_IMAGES"] == "256"
    assert lines["SERVE_API_KEYS"] == "(2 keys)" and "secret" not in done.stdout


@pytest.mark.parametrize("command", [["-m", "serve", "--check"], ["-m", "serve"],
                                     ["-m", "gunicorn", "-c", "python:serve.gunicorn_conf", "serve:create_app()"]],
                         ids=["check", "serve", "gunicorn"])
def test_a_bad_value_stops_the_start_with_one_line_and_exit_2(command):
    done = _run(command, {"SERVE_TOP_K": "0", "PORT": str(free_port()), "HOST": "127.0.0.1"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["serve: SERVE_TOP_K='0': must be at least 1"]


# -- readiness: a probe at most once a second ----------------------------------------------------


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


# -- the batcher: no model call over max_batch ---------------------------------------------------


def test_a_request_larger_than_max_batch_is_run_in_parts_of_at_most_max_batch():
    from serve.backends.batcher import Batcher

    calls = []

    def model(images):
        calls.append(len(images))
        return {"sum": images.reshape(len(images), -1).sum(axis=1)}

    batcher = Batcher(model, max_batch=4, max_wait_s=0)
    try:
        images = np.arange(10 * 3, dtype=np.uint8).reshape(10, 3)
        out = batcher.submit(images)
        assert max(calls) <= 4 and sum(calls) == 10
        np.testing.assert_array_equal(out["sum"], images.sum(axis=1))  # in order
        assert all(size <= 4 for size in batcher.batch_sizes)
    finally:
        batcher.close()


def test_a_failing_part_fails_the_whole_request():
    from serve.backends.batcher import Batcher

    def model(images):
        if images[0, 0] >= 4:
            raise RuntimeError("the second part broke")
        return {"x": images}

    batcher = Batcher(model, max_batch=4, max_wait_s=0)
    try:
        with pytest.raises(RuntimeError, match="second part"):
            batcher.submit(np.arange(8, dtype=np.uint8).reshape(8, 1))
    finally:
        batcher.close()


@pytest.mark.end_to_end
def test_the_local_backend_never_calls_the_model_with_more_than_max_batch(model_base):
    from serve import create_app

    app = create_app({"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": "cifar10", "MAX_BATCH": 8})
    backend = app.extensions["serve.backend"]
    backend.wait_loaded()
    try:
        images = np.random.default_rng(0).integers(0, 256, (50, 32, 32, 3), dtype=np.uint8)
        response = app.test_client().post("/v1/models/cifar10:predict", json={"instances": images.tolist()})
        assert response.status_code == 200 and len(response.get_json()["predictions"]) == 50
        assert max(backend.batch_sizes) <= 8
        whole = app.test_client().post("/v1/models/cifar10:predict", json={"instances": images[:8].tolist()})
        assert [p["class_ids"] for p in response.get_json()["predictions"][:8]] == [p["class_ids"] for p in whole.get_json()["predictions"]]
    finally:
        backend.close()


# -- /metrics is not a side door -----------------------------------------------------------------


def test_metrics_take_the_api_keys_when_they_have_none_of_their_own():
    from serve import create_app

    client = create_app({"MODEL_NAME": "cifar10", "API_KEYS": "k"}, backend=_Backend()).test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"X-API-Key": "k"}).status_code == 200
    open_server = create_app({"MODEL_NAME": "cifar10"}, backend=_Backend()).test_client()
    assert open_server.get("/metrics").status_code == 200  # no keys at all: open, as before


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
