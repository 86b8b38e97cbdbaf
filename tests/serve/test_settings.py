"""The server's settings: one typed object, every value checked at start (``python -m serve``, gunicorn's config,
``create_app``'s overrides), the bad one named in one line."""

import subprocess
import sys

import pytest

from fake_backend import FakeBackend
from live_server import free_port

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
        create_app({"MODEL_NAME": "cifar10", "TOP_K": 0}, backend=FakeBackend())


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
