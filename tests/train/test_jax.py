"""Training under Keras 3 on JAX (what TPUs run today), handed across to the TensorFlow export and server.

JAX and TensorFlow cannot both be Keras's backend in one process, and this test process runs
TensorFlow, so the JAX side runs in fresh processes, as `python -m train --keras-backend jax` does.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import synthetic
from contract import MANIFEST_FILE, SAMPLES_FILE, WEIGHTS_FILE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST_DEVICES = 8
# Predictions of the trained model, computed under JAX from the saved weights alone.
JAX_PREDICT = """
import sys
import numpy as np
import keras
from train import models
run, out = sys.argv[1:]
assert keras.backend.backend() == "jax"
samples = np.load(f"{run}/samples.npz")
model = models.build_model("seed_cnn", num_classes=3)
model.load_weights(f"{run}/model.weights.h5")
np.save(out, keras.ops.convert_to_numpy(model(samples["test_images"].astype("float32"), training=False)))
"""


def jax_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "JAX_PLATFORMS")}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "3", "XLA_FLAGS": f"--xla_force_host_platform_device_count={HOST_DEVICES}",
            **extra}


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory, splits):
    """seed_cnn trained under JAX, data parallel over 8 host devices, and its own predictions on the test sample."""
    tmp = tmp_path_factory.mktemp("jax")
    data = synthetic.write_tree(tmp / "data", splits)
    output = tmp / "run"
    command = [sys.executable, "-m", "train", "--keras-backend", "jax", "--data", str(data), "--output", str(output),
               "--epochs", "4", "--batch-size", "8", "--precision", "float32", "--profile-steps", "2,3"]
    result = subprocess.run(command, cwd=REPO, env=jax_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    predicted = tmp / "jax_predictions.npy"
    result = subprocess.run([sys.executable, "-c", JAX_PREDICT, str(output), str(predicted)], cwd=REPO,
                            env=jax_env(KERAS_BACKEND="jax"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return output, np.load(predicted)


def test_jax_run_learns_data_parallel_over_every_device(jax_run):
    output, _ = jax_run
    manifest = json.loads((output / MANIFEST_FILE).read_text())
    training = manifest["training"]
    assert (training["keras_backend"], training["strategy"], training["replicas"]) == ("jax", "DataParallel", HOST_DEVICES)
    assert training["global_batch"] == 8 * HOST_DEVICES and training["input_pipeline"] == "tf.data"
    assert manifest["metrics"]["test_accuracy"] > 0.8  # three classes: chance is 0.33
    assert "jax" in manifest["versions"]
    for path in ("eval/metrics.json", "history.csv", "curves.png", WEIGHTS_FILE, SAMPLES_FILE):
        assert (output / path).exists(), path
    assert list((output / "logs" / "train" / "plugins" / "profile").glob("*/*.xplane.pb")), "--profile-steps"
    assert not (output / "backup").exists()


def test_jax_weights_export_under_tensorflow_and_serve_the_jax_models_answers(jax_run, tmp_path):
    from export import exporter
    from serve import create_app

    output, jax_predictions = jax_run
    version = exporter.run(run_dir=str(output), model_dir=str(tmp_path), name="cifar10", verbose=0)  # fingerprint checked
    published = json.loads((tmp_path / "cifar10" / "1" / "assets.extra" / "manifest.json").read_text())
    assert published["training"]["keras_backend"] == "jax" and os.path.basename(version) == "1"

    images = np.load(output / SAMPLES_FILE)["test_images"]
    app = create_app({"TESTING": True, "MODEL_DIR": str(tmp_path / "cifar10"), "MODEL_NAME": "cifar10"})
    app.extensions["serve.backend"].wait_loaded()
    try:
        response = app.test_client().post("/v1/models/cifar10:predict", json={"instances": images.tolist()})
    finally:
        app.extensions["serve.backend"].close()
    assert response.status_code == 200, response.get_json()
    served = np.asarray([row["probabilities"] for row in response.get_json()["predictions"]], dtype=np.float32)
    np.testing.assert_allclose(served, jax_predictions, atol=1e-5)
    assert (served.argmax(axis=1) == jax_predictions.argmax(axis=1)).all()


def test_jax_backend_in_a_tensorflow_process_is_a_clear_error(tmp_path, capsys):
    from train import cli

    synthetic.write_tree(tmp_path / "data", synthetic.make_splits(train_per_class=4, test_per_class=2))
    code = cli.main(["--keras-backend", "jax", "--data", str(tmp_path / "data"), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err == "error: Keras is already loaded with the tensorflow backend in this process; " \
                  "train with --keras-backend jax in a new process"
    assert not (tmp_path / "out").exists()


BUILD_ALL = """
import sys
import numpy as np
import keras
from train import models
out = sys.argv[1]
assert keras.backend.backend() == "jax"
probe = models.fingerprint_images(5, count=4).astype("float32")
for name in models.model_names():
    model = models.build_model(name, num_classes=10)
    model.save_weights(f"{out}/{name}.weights.h5")
    np.save(f"{out}/{name}.npy", keras.ops.convert_to_numpy(model(probe, training=False)))
"""


def test_every_registered_model_builds_under_jax_and_loads_under_tensorflow(tmp_path):
    from train import models

    result = subprocess.run([sys.executable, "-c", BUILD_ALL, str(tmp_path)], cwd=REPO,
                            env=jax_env(KERAS_BACKEND="jax"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    probe = models.fingerprint_images(5, count=4).astype("float32")
    for name in models.model_names():
        model = models.build_model(name, num_classes=10)
        model.load_weights(str(tmp_path / f"{name}.weights.h5"))
        # Untrained weights on raw 0-255 pixels give huge logits, so float32 rounding between the
        # backends shows in the probabilities at about 1e-5; export's 1e-5 is for trained models.
        expected = np.load(tmp_path / f"{name}.npy")
        outputs = model(probe, training=False).numpy()
        np.testing.assert_allclose(outputs, expected, atol=1e-4)
        assert (outputs.argmax(axis=1) == expected.argmax(axis=1)).all(), name


def test_jax_trains_where_tensorflow_cannot_be_imported_and_tensorflow_exports_it(tmp_path, splits):
    """Colab's TPU runtimes ship JAX and no TensorFlow: the NumPy pipelines feed it, the handover is the same."""
    from export import exporter

    blocker = tmp_path / "blocker" / "tensorflow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('no tensorflow on this runtime')\n")
    data = synthetic.write_tree(tmp_path / "data", splits)
    output = tmp_path / "run"
    command = [sys.executable, "-m", "train", "--keras-backend", "jax", "--data", str(data), "--output", str(output),
               "--epochs", "8", "--batch-size", "8", "--precision", "float32"]
    env = jax_env(PYTHONPATH=os.pathsep.join([str(blocker.parent), REPO]))
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no tensorflow on this runtime" not in result.stderr
    manifest = json.loads((output / MANIFEST_FILE).read_text())
    assert "tensorflow" not in manifest["versions"] and manifest["training"]["replicas"] == HOST_DEVICES
    assert manifest["training"]["input_pipeline"] == "numpy"
    assert manifest["metrics"]["test_accuracy"] > 0.6  # three classes: chance is 0.33
    assert not (output / "logs").exists() or not list((output / "logs").rglob("events.out.tfevents*"))
    exporter.run(run_dir=str(output), model_dir=str(tmp_path / "models"), name="cifar10", verbose=0)  # fingerprint
    assert (tmp_path / "models" / "cifar10" / "1" / "saved_model.pb").exists()


@pytest.mark.parametrize("message", [
    "Gloo AllReduce failed: [external/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.59.0.2]:18146",
    "Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read error [10.59.0.2]:18146: Connection reset by peer",
])
def test_a_lost_peer_is_named_whichever_way_gloo_words_it(message):
    from train import jax_devices

    assert jax_devices.lost_peer(message) == "10.59.0.2"
    assert jax_devices.lost_peer("Gloo AllGather failed: timed out") is None
