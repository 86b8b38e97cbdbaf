import os
import shutil
import tempfile

# Quiet TensorFlow, and give this process 8 logical CPU devices before TensorFlow starts,
# so MirroredStrategy can exercise the code path of an 8-core TPU (per-replica batches,
# a global batch 8x, a distributed dataset).
from train import hardware  # noqa: E402  (imports neither TensorFlow nor JAX)
from train.quiet import native_startup  # noqa: E402

hardware.quiet_tensorflow()  # for this process and every one it starts: no cuInit error without a GPU
# oneDNN on, as `python -m train` sets it (train.hardware.prepare_environment), for this process and
# every one it starts: otherwise on an AVX2 CPU whether this process's TensorFlow had it would depend
# on whether a trainer ran in it before TensorFlow's first op.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import pytest  # noqa: E402  (the environment must be set before TensorFlow is imported)

import synthetic  # noqa: E402

LOGICAL_CPUS = 8


def pytest_configure(config):
    # prometheus-client picks its value store (memory, or multiprocess files) once, at import, from
    # PROMETHEUS_MULTIPROC_DIR: import it here, unset, so the in-process apps count in memory.
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    import prometheus_client  # noqa: F401

    with native_startup():  # TensorFlow's start-up lines before its logging is set up
        import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)

    # Every JAX process the tests start (python -m train --backend jax, the multi-process workers, the
    # notebook's kernel) compiles the same small programs again: seed_cnn's initializers and steps
    # cost a worker 25 of its 45 CPU seconds. JAX's persistent cache, one per session, compiles each
    # program once; a cached executable is the program XLA compiled (the weight digests of a cached
    # and an uncached run are identical), and nothing outside the session reads it.
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        config.jax_cache_dir = tempfile.mkdtemp(prefix="pytest-jax-cache-")
        os.environ.update(JAX_COMPILATION_CACHE_DIR=config.jax_cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                          JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


#: Session fixtures that train or export a real model: a serve test that needs one is end-to-end.
REAL_MODEL_FIXTURES = {"trained_run", "model_base", "mirrored_run"}
SERVE_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve")


def pytest_collection_modifyitems(config, items):
    """Refuse a serve test that needs a real model but is not marked ``end_to_end``: ``-m "not end_to_end"``
    would otherwise train one for it, and serve's unit tests must never wait for a training run."""
    unmarked = [item.nodeid for item in items
                if str(item.path).startswith(SERVE_TESTS + os.sep) and REAL_MODEL_FIXTURES & set(item.fixturenames)
                and item.get_closest_marker("end_to_end") is None]
    if unmarked:
        raise pytest.UsageError(f"serve tests that need a real model, not marked end_to_end: {', '.join(unmarked)}")


def pytest_unconfigure(config):
    if getattr(config, "jax_cache_dir", None):
        shutil.rmtree(config.jax_cache_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Whatever a test adds to or changes in os.environ is undone after it, so no test leaks into the next."""
    saved = dict(os.environ)
    yield
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


@pytest.fixture(scope="session")
def splits():
    """A small three-class data set that a model learns in a few epochs."""
    return synthetic.make_splits()


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, splits):
    """A finished seed_cnn training run on synthetic data: DIR with weights, manifest, eval and a held-out slice.

    48 of the 192 training images are held out, so every export made from it has an
    out-of-distribution threshold and answers ``in_distribution`` (export/calibration.py), as a run
    trained with ``--holdout`` does. (This small model gets every held-out image right by a wide
    margin, so no temperature minimises their NLL and its probabilities are served as trained.)
    """
    from train import trainer

    output = tmp_path_factory.mktemp("run")
    trainer.run(
        trainer.Config(
            output=str(output), precision="float32", tpu="none", profile_steps=(2, 3), verbose=0, holdout=48,
            # Fixed here rather than the recipe's: a confident model, so its int8 twin passes export's
            # 99% agreement gate on 48 test images (one image is 2%) whatever the recipe becomes.
            recipe=dict(epochs=4, batch_size=16, schedule="constant", augment=False, label_smoothing=0.0),
        ),
        splits=splits,
    )
    return output


@pytest.fixture(scope="session")
def model_base(tmp_path_factory, trained_run):
    """``models/cifar10``, holding version 1 exported from ``trained_run`` (what TF Serving's --model_base_path names)."""
    from export import exporter

    models = tmp_path_factory.mktemp("models")
    exporter.run(run_dir=str(trained_run), model_dir=str(models), name="cifar10", verbose=0)
    return models / "cifar10"


@pytest.fixture(scope="session")
def mirrored_strategy():
    import tensorflow as tf

    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(LOGICAL_CPUS)])


@pytest.fixture(scope="session")
def mirrored_run(tmp_path_factory, splits, mirrored_strategy):
    """A finished run under an 8-replica MirroredStrategy in mixed bfloat16: an 8-core TPU's code path."""
    from train import trainer

    output = tmp_path_factory.mktemp("mirrored-run")
    trainer.run(
        trainer.Config(output=str(output), recipe=dict(epochs=1, batch_size=8), precision="mixed_bfloat16", verbose=0),
        strategy=mirrored_strategy, splits=splits,
    )
    return output


@pytest.fixture(scope="module")
def app(real_app):
    """``real_app`` (tests/serve overrides ``app`` with the fake backend's, for serve's unit tests)."""
    return real_app


@pytest.fixture(scope="module")
def real_app(model_base):
    """The Flask app over the local backend and ``model_base``, with a 1 MiB upload limit."""
    from serve import create_app

    app = create_app({"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": "cifar10", "MAX_UPLOAD_MB": 1})
    app.extensions["serve.backend"].wait_loaded()
    yield app
    app.extensions["serve.backend"].close()


@pytest.fixture()
def client(app):
    return app.test_client()
