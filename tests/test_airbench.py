"""The airbench model: data-dependent whitening captured in the weights, test-time views inside the model,
its recipe as the one source of its defaults, and a run under 8 replicas that exports by name and serves."""

import json

import numpy as np
import pytest

import synthetic
from contract import MANIFEST_FILE
from train import airbench, models, trainer
from train.hardware import Placement


def _patches(x):
    normalised = (x.astype(np.float64) - np.asarray(models.CIFAR10_MEAN)) / np.asarray(models.CIFAR10_STD)
    windows = np.lib.stride_tricks.sliding_window_view(normalised, (2, 2), axis=(1, 2))
    return windows.transpose(0, 1, 2, 4, 5, 3).reshape(-1, 12)


def test_whitening_is_set_from_the_training_patches_and_decorrelates_them():
    model = models.build_model("airbench", num_classes=3)
    x, _ = synthetic.make_images(20)
    before = airbench.whiten_layer(model).kernel.numpy().copy()
    models.prepare("airbench", model, x)
    kernel = airbench.whiten_layer(model).kernel.numpy()
    assert not np.allclose(kernel, before)
    assert not airbench.whiten_layer(model).trainable, "the whitening stays as the data set it"
    filters = kernel.reshape(12, 24)
    np.testing.assert_allclose(filters[:, 12:], -filters[:, :12])  # each direction and its negative
    outputs = _patches(x) @ filters[:, :12]
    covariance = outputs.T @ outputs / len(outputs)
    # Unit variance up to the eigenvalue guard (WHITEN_EPS), and no correlation between filters.
    eigenvalues = np.linalg.eigvalsh(_patches(x).T @ _patches(x) / len(outputs))[::-1]
    np.testing.assert_allclose(np.diag(covariance), eigenvalues / (eigenvalues + airbench.WHITEN_EPS), rtol=1e-4)
    np.testing.assert_allclose(covariance - np.diag(np.diag(covariance)), 0, atol=1e-6)


def test_convolutions_start_as_the_identity_on_their_input_channels():
    kernel = airbench.PartialIdentity(seed=1)((3, 3, 4, 6)).numpy()
    for i in range(4):
        expected = np.zeros((3, 3, 4))
        expected[1, 1, i] = 1
        np.testing.assert_array_equal(kernel[..., i], expected)
    assert np.abs(kernel[..., 4:]).sum() > 0, "the other filters are random"


def test_inference_averages_six_views_and_training_sees_one():
    import tensorflow as tf

    model = models.build_model("airbench", num_classes=3)
    network = model.get_layer("views").network
    x = synthetic.make_images(2)[0][:4].astype(np.float32)
    padded = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)], mode="reflect")
    views = [x, padded[:, :32, :32], padded[:, 2:, 2:]]
    logits = [network(v, training=False).numpy() for v in views + [v[:, :, ::-1] for v in views]]
    expected = 0.5 * (logits[0] + logits[3]) / 2 + 0.25 * (logits[1] + logits[4] + logits[2] + logits[5]) / 2
    np.testing.assert_allclose(model(x, training=False).numpy(), tf.nn.softmax(expected).numpy(), atol=1e-6)
    # One view when training; BatchNorm then normalises by the batch, so compare with the network in that mode.
    np.testing.assert_allclose(model(x, training=True).numpy(), tf.nn.softmax(network(x, training=True)).numpy(),
                               atol=1e-6)


def test_airbench_trains_by_its_recipe_block_when_no_flag_says_otherwise():
    recipe = models.recipe("airbench")
    assert recipe is airbench.AIRBENCH_RECIPE
    plan = trainer._plan(trainer.Config(model="airbench", precision="float32"), recipe,
                         Placement("tensorflow", "test", "cpu", replicas=1), 50_000)
    for key in ("epochs", "batch_size", "schedule", "augment", "crop_padding", "label_smoothing"):
        assert getattr(plan, key) == getattr(recipe, key), key
    assert plan.learning_rate == recipe.learning_rate  # 1 replica x 1024 is the reference batch
    assert (plan.schedule, plan.global_batch, plan.steps_per_epoch) == ("triangle", 1024, 48)


def test_triangle_schedule_rises_to_the_peak_then_falls_to_its_floor():
    from train import schedules

    rate = schedules.triangle(2.0, warmup_steps=10, total_steps=110)
    values = [float(rate(step)) for step in (0, 5, 10, 60, 110, 200)]
    np.testing.assert_allclose(values, [0.4, 1.2, 2.0, 2.0 * (1 - 0.93 / 2), 0.14, 0.14], rtol=1e-6)


@pytest.fixture(scope="module")
def airbench_run(tmp_path_factory, splits, mirrored_strategy):
    output = tmp_path_factory.mktemp("airbench-run")
    trainer.run(trainer.Config(model="airbench", output=str(output), epochs=1, batch_size=8, precision="float32",
                               verbose=0), strategy=mirrored_strategy, splits=splits)
    return output


def test_airbench_trains_under_8_replicas_and_its_whitening_reaches_export_and_the_server(airbench_run, splits,
                                                                                          tmp_path):
    from export import exporter
    from serve import create_app

    manifest = json.loads((airbench_run / MANIFEST_FILE).read_text())
    assert (manifest["model"]["name"], manifest["training"]["replicas"]) == ("airbench", 8)
    assert manifest["training"]["schedule"] == "triangle"
    # The weights file carries the data's whitening: a fresh build loading it has exactly that kernel.
    fresh = models.build_model("airbench", num_classes=3)
    expected = models.build_model("airbench", num_classes=3)
    models.prepare("airbench", expected, splits.x_train)
    fresh.load_weights(str(airbench_run / "model.weights.h5"))
    np.testing.assert_allclose(airbench.whiten_layer(fresh).kernel.numpy(),
                               airbench.whiten_layer(expected).kernel.numpy(), rtol=1e-5, atol=1e-6)

    exporter.run(run_dir=str(airbench_run), model_dir=str(tmp_path), name="cifar10", verbose=0)  # fingerprint
    app = create_app({"TESTING": True, "MODEL_DIR": str(tmp_path / "cifar10"), "MODEL_NAME": "cifar10"})
    app.extensions["serve.backend"].wait_loaded()
    try:
        images = splits.x_test[:6]
        response = app.test_client().post("/v1/models/cifar10:predict", json={"instances": images.tolist()})
    finally:
        app.extensions["serve.backend"].close()
    assert response.status_code == 200, response.get_json()
    served = np.asarray([row["probabilities"] for row in response.get_json()["predictions"]], np.float32)
    np.testing.assert_allclose(served, fresh(images.astype(np.float32), training=False).numpy(), atol=1e-5)
