"""The airbench model: data-dependent whitening captured in the weights, test-time views inside the model,
its recipe as the one source of its defaults, and a run under 8 replicas that exports by name and serves."""

import dataclasses
import json

import numpy as np
import pytest

import synthetic
from contract import MANIFEST_FILE
from train import airbench, airbench_layers, models, report, trainer
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
    kernel = airbench_layers.PartialIdentity(seed=1)((3, 3, 4, 6)).numpy()
    for i in range(4):
        expected = np.zeros((3, 3, 4))
        expected[1, 1, i] = 1
        np.testing.assert_array_equal(kernel[..., i], expected)
    assert np.abs(kernel[..., 4:]).sum() > 0, "the other filters are random"


def test_weights_start_at_pytorchs_default_scale():
    model = models.build_model("airbench", num_classes=10)
    network = model.get_layer("views").network
    kernel = network.get_layer("group2_conv1").kernel.numpy()[..., 64:]  # filters past the identity ones
    # PyTorch's 1 / sqrt(fan_in), as the float32 weights can hold it (a draw can round onto the bound);
    # Glorot would allow 0.0456.
    bound = np.float32(1 / np.sqrt(3 * 3 * 64))
    assert bound * 0.95 < np.abs(kernel).max() <= bound
    logits = network.get_layer("logits").kernel.numpy()
    assert 1 / 16 * 0.9 < np.abs(logits).max() <= 1 / 16


def _lookahead_reference(start, steps_per_epoch, epochs, total, steps):
    """airbench94's training loop with its lookahead, transcribed: ``steps[k]`` is what step k adds to the weights."""
    net, average, step, ends = np.zeros_like(steps[0]), None, 0, []
    for epoch in range(epochs):
        for _ in range(steps_per_epoch):
            net = net + steps[step]
            step += 1
            if epoch >= start and step % 5 == 0:
                if average is None:
                    average = net.copy()
                else:
                    decay = 0.95 ** 5 * (step / total) ** 3
                    average = average + (1 - decay) * (net - average)  # lerp_(net, 1 - decay)
                    net = average.copy()
        if average is not None:
            net = average.copy()
        ends.append(net)
    return ends


def test_lookahead_averages_as_airbench_does_and_a_resumed_run_continues_exactly():
    import keras

    steps_per_epoch, epochs = 7, 7  # updates every 5 steps fall across epoch boundaries
    total = steps_per_epoch * epochs
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.BatchNormalization(name="bn")(keras.layers.Dense(4, name="d")(inputs)))
    weights = [w for w in model.weights]
    assert any(not w.trainable for w in weights), "BatchNorm's statistics are averaged too"
    sizes = [int(np.prod(w.shape)) for w in weights]
    rng = np.random.default_rng(0)
    steps = rng.normal(size=(total, sum(sizes)))

    def flat():
        return np.concatenate([w.numpy().ravel() for w in weights])

    def drive(restart_at=None):
        for w in weights:
            w.assign(np.zeros(w.shape))
        callback, ends = None, []
        for epoch in range(epochs):
            if callback is None or epoch == restart_at:  # a new process resuming from the epoch's backup
                callback = airbench.Lookahead(total)
                callback.set_model(model)
                callback.set_params({"steps": steps_per_epoch})
            callback.on_epoch_begin(epoch)
            for batch in range(steps_per_epoch):
                for w, part in zip(weights, np.split(steps[epoch * steps_per_epoch + batch], np.cumsum(sizes)[:-1])):
                    w.assign(w.numpy() + part.reshape(w.shape))
                callback.on_train_batch_end(batch)
            ends.append(flat())
        return ends

    expected = _lookahead_reference(airbench.LOOKAHEAD_START_EPOCH, steps_per_epoch, epochs, total, steps)
    np.testing.assert_allclose(np.cumsum(steps[:steps_per_epoch], axis=0)[-1], expected[0])  # no averaging yet
    for ends in (drive(), drive(restart_at=5)):
        np.testing.assert_allclose(ends, expected, rtol=1e-5, atol=1e-5)


def test_the_whitening_bias_learns_for_three_epochs_then_holds():
    import keras

    hold = [c for c in models.training_callbacks("airbench", 480) if isinstance(c, airbench.HoldFrom)]
    assert len(hold) == 1 and hold[0].epoch == airbench.WHITEN_BIAS_EPOCHS == 3
    built = models.build_model("airbench", num_classes=3)
    assert hold[0].get_variable(built) is airbench.whiten_bias(built) and airbench.whiten_bias(built).trainable

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="d")(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.85, nesterov=True), loss="mse")
    biases, kernels = [], []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: (
        biases.append(model.get_layer("d").bias.numpy().copy()), kernels.append(model.get_layer("d").kernel.numpy().copy())))
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    model.fit(x, x[:, :2] + 1, batch_size=8, epochs=3, verbose=0,
              callbacks=[airbench.HoldFrom(lambda m: m.get_layer("d").bias, epoch=1), record])
    assert np.abs(biases[0]).max() > 0.01, "it learns in the first epoch"
    np.testing.assert_array_equal(biases[1], biases[0])  # then holds, momentum and all
    np.testing.assert_array_equal(biases[2], biases[0])
    assert not np.allclose(kernels[2], kernels[1]), "the other weights keep learning"


def test_the_recipe_callbacks_set_the_weights_under_jax_as_under_tensorflow(tmp_path):
    """Keras's JAX trainer keeps the training state apart from the variables between steps: the callbacks
    must reach it there, on 8 data-parallel devices, and give what the same fit gives under TensorFlow."""
    import os
    import subprocess
    import sys

    import recipe_callbacks_fit

    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    support = os.path.dirname(recipe_callbacks_fit.__file__)
    env.update(KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(support)), support]))
    out = tmp_path / "jax.npz"
    result = subprocess.run([sys.executable, "-m", "recipe_callbacks_fit", str(out)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    under_jax = dict(np.load(out))
    under_tensorflow = recipe_callbacks_fit.fit()
    without = recipe_callbacks_fit.fit(with_callbacks=False)
    assert under_jax.keys() == under_tensorflow.keys()
    for path, value in under_tensorflow.items():
        np.testing.assert_allclose(under_jax[path], value, rtol=1e-4, atol=1e-5, err_msg=path)
    assert not np.allclose(under_tensorflow["out/kernel"], without["out/kernel"]), "the callbacks changed the run"


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


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-6), ("bfloat16", 2 ** -7)])
def test_gelu_is_the_exact_gelu_and_its_gradient_when_training_as_when_serving(dtype, tolerance):
    import math

    import tensorflow as tf

    grid = np.linspace(-6, 6, 2001)
    values = 0.5 * grid * np.vectorize(math.erfc)(-grid / math.sqrt(2))  # x Phi(x), in float64
    slopes = 0.5 * np.vectorize(math.erfc)(-grid / math.sqrt(2)) + grid * np.exp(-grid ** 2 / 2) / math.sqrt(2 * math.pi)
    x = tf.cast(grid, dtype)
    layer = airbench_layers.GELU(dtype="mixed_bfloat16" if dtype == "bfloat16" else "float32")  # as under --precision
    for training in (True, False):  # True: the XLA-compiled loops under TensorFlow; False: keras.activations.gelu
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=training)
        assert y.dtype == x.dtype
        slope = tape.gradient(y, x)
        scale = 1 + np.abs(grid)
        np.testing.assert_allclose(tf.cast(y, tf.float64).numpy() / scale, values / scale, atol=tolerance,
                                   err_msg=f"training={training}")
        np.testing.assert_allclose(tf.cast(slope, tf.float64).numpy(), slopes, atol=4 * tolerance,
                                   err_msg=f"training={training}")


def test_airbench_trains_by_its_recipe_block_when_no_flag_says_otherwise():
    recipe = models.recipe("airbench")
    assert recipe is airbench.AIRBENCH_RECIPE
    plan = trainer._plan(trainer.Config(model="airbench", precision="float32"), recipe,
                         Placement("tensorflow", "test", "cpu", replicas=1), 50_000)
    assert plan.recipe is recipe
    assert plan.learning_rate == recipe.learning_rate  # 1 replica x 1024 is the reference batch
    assert (plan.recipe.schedule, plan.global_batch, plan.steps_per_epoch) == ("triangle", 1024, 48)


def test_triangle_schedule_rises_to_the_peak_then_falls_to_its_floor():
    from train import schedules

    rate = schedules.triangle(2.0, warmup_steps=10, total_steps=110)
    values = [float(rate(step)) for step in (0, 5, 10, 60, 110, 200)]
    np.testing.assert_allclose(values, [0.4, 1.2, 2.0, 2.0 * (1 - 0.93 / 2), 0.14, 0.14], rtol=1e-6)


def test_the_recipe_steps_as_pytorchs_nesterov_sgd_under_a_changing_rate():
    import keras

    from train import schedules

    recipe = models.recipe("airbench")
    assert recipe.optimizer == "sgd_pytorch"
    rates, momentum, gradients = [0.2, 0.6, 1.0, 0.5], 0.85, [1.0, -2.0, 0.5, 3.0]
    # torch.optim.SGD(nesterov=True): buf = momentum * buf + g; w -= lr * (g + momentum * buf)
    weight, buffer, expected = 1.0, 0.0, []
    for rate, gradient in zip(rates, gradients):
        buffer = momentum * buffer + gradient
        weight -= rate * (gradient + momentum * buffer)
        expected.append(weight)

    step = keras.Variable(0, dtype="int64", trainable=False)
    optimizer = schedules.optimizer(recipe, 1.0, "constant", 4)
    optimizer.learning_rate = lambda: keras.ops.take(keras.ops.convert_to_tensor(rates), step)
    variable = keras.Variable(1.0)
    got = []
    for index, gradient in enumerate(gradients):
        step.assign(index)
        optimizer.apply([keras.ops.convert_to_tensor(gradient)], [variable])
        got.append(float(variable.numpy()))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # Keras's own SGD keeps rate x gradient in its velocity: the same first step, then not.
    keras_sgd = schedules.optimizer(dataclasses.replace(recipe, optimizer="sgd"), 1.0, "constant", 4)
    keras_sgd.learning_rate = optimizer.learning_rate
    other = keras.Variable(1.0)
    for index, gradient in enumerate(gradients[:2]):
        step.assign(index)
        keras_sgd.apply([keras.ops.convert_to_tensor(gradient)], [other])
    assert abs(float(other.numpy()) - expected[1]) > 0.1


@pytest.fixture(scope="module")
def airbench_run(tmp_path_factory, splits, mirrored_strategy):
    output = tmp_path_factory.mktemp("airbench-run")
    trainer.run(trainer.Config(model="airbench", output=str(output), recipe=dict(epochs=1, batch_size=8), precision="float32",
                               validation_freq=2, verbose=0), strategy=mirrored_strategy, splits=splits)
    return output


def test_airbench_trains_under_8_replicas_and_its_whitening_reaches_export_and_the_server(airbench_run, splits,
                                                                                          tmp_path):
    from export import exporter
    from serve import create_app

    manifest = json.loads((airbench_run / MANIFEST_FILE).read_text())
    assert (manifest["model"]["name"], manifest["training"]["replicas"]) == ("airbench", 8)
    assert manifest["training"]["recipe"] == {**dataclasses.asdict(models.recipe("airbench")), "epochs": 1, "batch_size": 8}
    # --validation-freq 2 skipped the test split after the one epoch; the handover still measured it, and the
    # history and its plot take the gap.
    assert report.read_history(str(airbench_run / "history.csv"))[0].keys().isdisjoint({"val_accuracy", "val_loss"})
    assert manifest["metrics"]["test_images"] == len(splits.x_test) and (airbench_run / "curves.png").exists()
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
